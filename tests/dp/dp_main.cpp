// dp_main.cpp — main() of the data-parallel tests: the job's communicator first, then GoogleTest.
// Only rank 0 prints the test log; a failure on another rank is printed by that rank with its number.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "dp_world.h"

namespace zinf::test {
namespace {
std::unique_ptr<Comm> g_world;

class RankFailures : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailures(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};
}  // namespace

Comm& world() { return *g_world; }

void within(int seconds, const std::string& what, const std::function<void()>& f) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lk(mu);
    if (cv.wait_for(lk, std::chrono::seconds(seconds), [&] { return done; })) return;
    std::fprintf(stderr, "rank %d: %s did not finish within %d s: the ranks are waiting for each other\n",
                 world().rank(), what.c_str(), seconds);
    std::fflush(stderr);
    world().abort(3);
  });
  struct Done {  // also when f throws
    std::mutex& mu;
    std::condition_variable& cv;
    bool& done;
    std::thread& t;
    ~Done() {
      {
        std::lock_guard<std::mutex> lk(mu);
        done = true;
      }
      cv.notify_all();
      t.join();
    }
  } finish{mu, cv, done, watchdog};
  f();
}

}  // namespace zinf::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  zinf::test::g_world = zinf::make_world_comm(zinf::detect_world());
  const int rank = zinf::test::g_world->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new zinf::test::RankFailures(rank));
  }
  const int rc = RUN_ALL_TESTS();
  // The job passes only when every rank passed.
  const bool failed = zinf::test::g_world->any(rc != 0);
  zinf::test::g_world.reset();
  return failed ? 1 : 0;
}
