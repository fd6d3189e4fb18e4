// run.dir as one run's own: a lock that keeps a second run out, and status.json, which says how the run ended.
#pragma once
#include <string>
#include <vector>

namespace mt {

// run.dir's lock: flock on run.dir/.lock, held (by global rank 0) for the life of the run, so that two runs never
// write one run.dir. The file names the holder ("pid P on host H"). Returns the descriptor, or -1 with `holder`
// set to what the file says of the run that holds it.
int lock_run_dir(const std::string& run_dir, std::string& holder);
void unlock_run_dir(int fd);

// run.dir/status.json, written atomically: how the run ended (or that it is running). `fields` are JSON members
// ("\"state\": \"completed\"", ...), one per line, so that a shell script can read them with sed.
void write_run_status(const std::string& run_dir, const std::vector<std::string>& fields);

}  // namespace mt
