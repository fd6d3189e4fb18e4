// optim.staleness_policy (docs/staleness.md). Apart from stale_gradients.h so that train/config.h can hold one
// without the communicator headers.
#pragma once
#include <cstdint>

#include "core/enum_names.h"

namespace mt {

// Newest: apply every average already complete (staleness 0 to S); Fixed: exactly those S steps old.
enum class StalenessPolicy : uint8_t { Newest, Fixed };

inline const auto& enum_names(StalenessPolicy) {
  static constexpr EnumName<StalenessPolicy> names[] = {{StalenessPolicy::Newest, "newest"},
                                                        {StalenessPolicy::Fixed, "fixed"}};
  return names;
}

}  // namespace mt
