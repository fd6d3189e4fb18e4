// build/sample: generates from a run's exported weights (run.dir/model.safetensors with run.dir/config.yaml): the
// prompt, then new tokens drawn one at a time (train/sampler.h). One process, or tp x pp ranks under mpirun.
//   build/sample --run DIR [--prompt TEXT | --prompt-ids 1,2,3] [--tokens N] [--temperature T] [--top-k K] [--seed S]
//                [--tokenizer FILE] [--tp N] [--pp N]
//   build/sample --tokenizer FILE --encode TEXT | --decode IDS     (no model: the tokenizer alone)
// Exit status: 0 success; 2 a bad flag, run folder, prompt, weights or tokenizer file, or a mesh that does not fit
// the ranks or the model (the message says which).
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "comm/agree_on_setup.h"
#include "comm/comm_util.h"
#include "comm/mpi_init.h"
#include "core/errors.h"
#include "core/threads.h"
#include "data/bpe_tokenizer.h"
#include "train/config.h"
#include "train/sampler.h"

namespace {

const char* kUsage =
    "usage: sample --run DIR [--prompt TEXT | --prompt-ids IDS] [--tokens N] [--temperature T] [--top-k K]\n"
    "              [--seed S] [--ids] [--weights FILE] [--tokenizer FILE] [--tp N] [--pp N] [--set KEY=VALUE]...\n"
    "       sample --tokenizer FILE (--encode TEXT | --decode IDS)\n"
    "\n"
    "Generates from a run's exported model: DIR/config.yaml (the run's config) and DIR/model.safetensors (the\n"
    "weights the trainer writes at the end). GPT-2 and Llama in fp32, the whole model on this one process, or split\n"
    "over tp x pp ranks: mpirun -np N build/sample --tp T --pp P ... with T x P = N.\n"
    "\n"
    "  --run DIR          the run folder (run.dir)\n"
    "  --weights FILE     another safetensors file with Hugging Face names (default DIR/model.safetensors)\n"
    "  --prompt TEXT      the prompt as UTF-8 text (byte-level models: data.source text; others with --tokenizer)\n"
    "  --prompt-ids IDS   the prompt as comma-separated token ids (any model)\n"
    "  --tokens N         new tokens to generate (default 64)\n"
    "  --temperature T    softmax temperature (default 1.0); 0 = greedy (the most likely token)\n"
    "  --top-k K          draw among the K most likely tokens only (default 0: all)\n"
    "  --seed S           the draws' seed (default 1234): the same seed gives the same text\n"
    "  --ids              print token ids instead of text (the default for models that are not byte-level and\n"
    "                     have no --tokenizer)\n"
    "  --tokenizer FILE   a GPT-2 byte-level BPE tokenizer (Hugging Face's tokenizer.json, or vocab.json with\n"
    "                     merges.txt beside it, or their folder): encodes --prompt, decodes the output, and\n"
    "                     draws only its ids (a model's vocabulary may be larger)\n"
    "  --encode TEXT      print the tokenizer's ids for TEXT, and exit\n"
    "  --decode IDS       print the tokenizer's text for comma-separated ids, and exit\n"
    "  --tp N, --pp N     split the model over N tensor-parallel ranks and N pipeline stages (default 1 and 1)\n"
    "  --set KEY=VALUE    override a key of the run's config (e.g. model.seq_len is not one to change)\n"
    "  --help, -h         this text\n"
    "Exit status: 0 success, 2 a bad flag, run folder, prompt, weights or tokenizer file, or a mesh that does not\n"
    "fit the ranks or the model.\n";

long long number(const std::string& flag, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
    mt::input_error("{} expects an integer in [{}, {}], got '{}'", flag, lo, hi, v);
  return x;
}

std::vector<int32_t> parse_ids(const std::string& flag, const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) ids.push_back(int32_t(number(flag, item, 0, (1LL << 31) - 1)));
  return ids;
}

// How many ranks mpirun started (MPICH's and Open MPI's environment), without initialising MPI.
int launched_ranks() {
  for (const char* v : {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE"})
    if (const char* n = std::getenv(v)) return std::max(1, std::atoi(n));
  return 1;
}

bool mpi_started() {
  int started = 0;
  MPI_Initialized(&started);
  return started;
}

void print_ids(const std::vector<int32_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string run, weights, prompt, prompt_ids, tokenizer_path, encode, decode;
    bool have_prompt = false, have_ids = false, want_ids = false, have_encode = false, have_decode = false;
    std::vector<std::string> sets;
    mt::SampleOptions o;
    int tp = 1, pp = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) mt::input_error("{} needs a value\n{}", f, kUsage);
        return argv[++i];
      };
      if (f == "--help" || f == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (f == "--run") run = next();
      else if (f == "--weights") weights = next();
      else if (f == "--prompt") prompt = next(), have_prompt = true;
      else if (f == "--prompt-ids") prompt_ids = next(), have_ids = true;
      else if (f == "--tokens") o.tokens = int(number(f, next(), 0, 1 << 20));
      else if (f == "--top-k") o.top_k = int(number(f, next(), 0, 1 << 30));
      else if (f == "--seed") o.seed = uint64_t(number(f, next(), 0, (1LL << 62)));
      else if (f == "--ids") want_ids = true;
      else if (f == "--tp") tp = int(number(f, next(), 1, 4096));
      else if (f == "--pp") pp = int(number(f, next(), 1, 4096));
      else if (f == "--tokenizer") tokenizer_path = next();
      else if (f == "--encode") encode = next(), have_encode = true;
      else if (f == "--decode") decode = next(), have_decode = true;
      else if (f == "--set") sets.push_back(next());
      else if (f == "--temperature") {
        const std::string v = next();
        char* end = nullptr;
        o.temperature = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0' || !(o.temperature >= 0) || o.temperature > 1e6)
          mt::input_error("--temperature expects a number >= 0, got '{}'", v);
      } else mt::input_error("unknown argument '{}'\n{}", f, kUsage);
    }
    std::optional<mt::BpeTokenizer> tokenizer;
    if (!tokenizer_path.empty()) tokenizer = mt::BpeTokenizer::load(tokenizer_path);
    if (have_encode || have_decode) {
      if (!tokenizer) mt::input_error("--encode and --decode need --tokenizer FILE");
      if (have_encode && have_decode) mt::input_error("give --encode or --decode, not both");
      if (have_encode) print_ids(tokenizer->encode(encode));
      else std::printf("%s\n", mt::valid_utf8(tokenizer->decode(parse_ids("--decode", decode))).c_str());
      return 0;
    }
    const int launched = launched_ranks();
    if (tp * pp == 1 && launched > 1)
      mt::input_error("started on {} ranks: give --tp and --pp with tp x pp = {} to split the model over them",
                      launched, launched);
    if (tp * pp > 1) mt::init_mpi(&argc, &argv);
    if (run.empty()) mt::input_error("missing --run DIR (a run folder with config.yaml and model.safetensors)\n{}",
                                     kUsage);
    if (have_prompt == have_ids)
      mt::input_error("give the prompt as --prompt TEXT or as --prompt-ids IDS (one of them)");
    mt::Config cfg;  // the run folder may be unreadable on some hosts only: every rank learns whether any failed
    mt::agreed_setup([&] { cfg = mt::load_config(run + "/config.yaml", sets); },
                     mpi_started() ? MPI_COMM_WORLD : MPI_COMM_NULL);
    const bool bytes = cfg.data.source == mt::DataSource::Text && !tokenizer;
    if (have_prompt && !bytes && !tokenizer)
      mt::input_error("--prompt TEXT needs a byte-level model (data.source: text) or --tokenizer FILE; this run's "
                      "data is {}: use --prompt-ids, or give its tokenizer", mt::name_of(cfg.data.source));
    if (tokenizer && tokenizer->vocab_size() > cfg.model.vocab_size)
      mt::input_error("the tokenizer '{}' has {} tokens, more than the model's vocabulary (model.vocab_size={})",
                      tokenizer_path, tokenizer->vocab_size(), cfg.model.vocab_size);
    if (tokenizer) o.vocab_limit = tokenizer->vocab_size();  // the model's padding ids have no text
    std::vector<int32_t> ids;
    if (have_prompt && tokenizer)
      ids = tokenizer->encode(prompt);
    else if (have_prompt)
      for (unsigned char c : prompt) ids.push_back(int32_t(c));
    else
      ids = parse_ids("--prompt-ids", prompt_ids);
    mt::set_compute_threads(mt::default_compute_threads(1));
    std::vector<int32_t> out;
    {  // the sampler's communicators are freed before MPI_Finalize (after it, they leaked)
      mt::Sampler sampler(cfg, weights.empty() ? run + "/model.safetensors" : weights, tp, pp);
      out = sampler.generate(ids, o);
    }
    int rank = 0;
    if (mpi_started()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0 && (want_ids || (!bytes && !tokenizer))) {
      print_ids(out);
    } else if (rank == 0) {
      std::fputs(tokenizer ? mt::valid_utf8(tokenizer->decode(out)).c_str() : mt::decode_bytes(out).c_str(),
                 stdout);
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);
    return mpi_started() ? mt::finalize_mpi(0) : 0;
  } catch (const mt::InputError& e) {
    // Bad input reaches here on every rank together (flags, config and prompt are the same everywhere; files are
    // agreed on), so the ranks finalize in step and rank 0 says what is wrong. MPI_Abort instead could end the
    // job before mpiexec has passed the message on.
    int rank = 0;
    if (mpi_started()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::fprintf(stderr, "sample: %s\n", e.what());
    return mpi_started() ? mt::finalize_mpi(2) : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sample: failed: %s\n", e.what());
    if (mpi_started()) mt::abort_job(1);  // the other ranks may be waiting on this one
    return 1;
  }
}
