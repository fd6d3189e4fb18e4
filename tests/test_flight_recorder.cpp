// The flight recorder's ring and dump (src/comm/flight_recorder.h) on one process: what a dump holds after the ring
// overflowed, states and places, and whole, parseable dumps while another thread records (under the sanitizers, the
// locking too). The whole-program cases (hangs, desyncs, SIGUSR2) are tests/py/test_flight_recorder.py.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/flight_recorder.h"
#include "core/json.h"
#include "test_support.h"

using namespace mt;

namespace {

Json read_dump(const std::string& dir) {
  std::ifstream f(dir + "/rank_0.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_json(ss.str());
}

}  // namespace

TEST_CASE("the flight recorder keeps each group's last operations, with their states and places", "[flight]") {
  FlightRecorder& rec = FlightRecorder::get();
  const std::string dir = test::tmp_path("flight_recorder", "ring");
  rec.configure(4, dir, 0, 1);
  const int g = rec.add_group("dp", {0, 2}, 0);
  flight_where().step = 7;
  uint64_t last = 0;
  for (int i = 0; i < 10; ++i) {  // 10 operations into a ring of 4: the first 6 leave it
    FlightSite site("gradient bucket", i);
    last = rec.issue(g, i % 2 ? CommKind::Send : CommKind::AllReduce, 100 + i, DType::F32,
                     static_cast<int>(ReduceOp::Sum), i % 2 ? 1 : -1, i % 2 ? 5 : -1);
  }
  CHECK(last == 10);
  rec.started(g, 9, 1.0);
  rec.completed(g, 8, 2.0, 3.0);
  rec.completed(g, 2, 2.0, 3.0);  // left the ring: ignored
  REQUIRE(rec.dump("test"));
  const Json d = read_dump(dir);
  CHECK(d.get("reason")->string == "test");
  const Json* groups = d.get("groups");
  REQUIRE(groups);
  const Json& grp = groups->array.back();
  CHECK(grp.get("name")->string == "dp");
  CHECK(grp.get("issued")->number == 10);
  CHECK(grp.get("collectives_issued")->number == 5);
  CHECK(grp.get("dropped")->number == 6);
  const auto& ops = grp.get("ops")->array;
  REQUIRE(ops.size() == 4);
  CHECK(ops[0].get("seq")->number == 7);
  CHECK(ops[0].get("coll_seq")->number == 4);  // operations 1, 3, 5, 7 were the collectives
  CHECK(ops[0].get("op")->string == "all_reduce");
  CHECK(ops[0].get("reduce")->string == "sum");
  CHECK(ops[1].get("op")->string == "send");
  CHECK(ops[1].get("coll_seq")->type == Json::Type::Null);
  CHECK(ops[1].get("peer")->number == 1);
  CHECK(ops[1].get("tag")->number == 5);
  CHECK(ops[1].get("state")->string == "completed");
  CHECK(ops[2].get("state")->string == "started");
  CHECK(ops[3].get("state")->string == "queued");
  CHECK(ops[3].get("count")->number == 109);
  CHECK(ops[3].get("where")->get("step")->number == 7);
  CHECK(ops[3].get("where")->get("site")->string == "gradient bucket 9");
  flight_where() = FlightWhere{};
}

TEST_CASE("flight recorder dumps are whole while another thread records", "[flight]") {
  FlightRecorder& rec = FlightRecorder::get();
  const std::string dir = test::tmp_path("flight_recorder", "threads");
  rec.configure(64, dir, 0, 1);
  const int g = rec.add_group("tp", {0, 1}, 0);
  std::atomic<bool> stop{false};
  std::thread issuer([&] {
    while (!stop) {
      const uint64_t seq = rec.issue(g, CommKind::AllReduce, 1, DType::F32, 0, -1, -1);
      rec.completed(g, seq, 0, 1);
    }
  });
  for (int i = 0; i < 50; ++i) {
    REQUIRE(rec.dump("while recording"));
    const Json d = read_dump(dir);  // throws on a torn file
    const Json& grp = d.get("groups")->array.back();
    CHECK(grp.get("ops")->array.size() <= 64);
  }
  stop = true;
  issuer.join();
}
