// Unicode's letters (\p{L}) and numbers (\p{N}), for the GPT-2 tokenizer's pre-tokenizer. The tables are generated
// (scripts/gen_unicode_classes.py).
#pragma once

namespace mt {

bool is_unicode_letter(char32_t c);
bool is_unicode_number(char32_t c);

}  // namespace mt
