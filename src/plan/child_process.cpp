// Child processes on pipes (see child_process.h).
#include "plan/child_process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>

extern char** environ;

namespace mt::plan {

ChildProcess::ChildProcess(const std::vector<std::string>& command) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("planner: pipe failed");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]), close(in[1]);
    throw std::runtime_error("planner: pipe failed");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);  // dup2 clears close-on-exec on 0 and 1
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    close(in[1]), close(out[0]);
    throw std::runtime_error("planner: cannot start " + command[0]);
  }
  to_ = in[1];
  from_ = fdopen(out[0], "r");
}

bool ChildProcess::send(const std::string& line) {
  const std::string s = line + "\n";
  return to_ >= 0 && write(to_, s.data(), s.size()) == ssize_t(s.size());
}

std::string ChildProcess::receive() {
  char buf[512];
  if (!from_ || !std::fgets(buf, sizeof buf, from_)) return "";
  std::string s(buf);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

bool ChildProcess::reap() {
  if (pid_ < 0) return false;
  if (to_ >= 0) close(to_);
  if (from_) std::fclose(from_);
  to_ = -1;
  from_ = nullptr;
  int status = 0;
  const bool ok = waitpid(pid_, &status, 0) == pid_ && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  pid_ = -1;
  return ok;
}

}  // namespace mt::plan
