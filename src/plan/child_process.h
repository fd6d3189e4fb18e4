// A child process that the planner talks to over its stdin and stdout, one line at a time: the time-sharing
// probe's copies (plan/time_sharing.h) and the calibration's neighbours (plan/neighbours.h).
#pragma once
#include <cstdio>
#include <string>
#include <sys/types.h>
#include <vector>

namespace mt::plan {

class ChildProcess {
 public:
  // Starts argv `command` with its stdin and stdout connected to this object. Throws std::runtime_error.
  explicit ChildProcess(const std::vector<std::string>& command);
  ~ChildProcess() { reap(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool send(const std::string& line);  // writes line + '\n'; false when the child has gone
  std::string receive();               // its next line without the '\n'; "" at end of file
  // Closes its stdin (which ends a child waiting there) and waits for it: whether it exited with status 0.
  bool reap();

 private:
  pid_t pid_ = -1;
  int to_ = -1;           // its stdin
  FILE* from_ = nullptr;  // its stdout
};

}  // namespace mt::plan
