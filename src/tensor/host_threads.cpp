#include "tensor/host_threads.hpp"

#include <cblas.h>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unistd.h>
#include <vector>

namespace meshmoe {

namespace {

thread_local bool t_in_parts = false;
bool g_reversed = false;  // host loops backwards (host_loop_reversed)
int g_saved_blas_threads = 0;

class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  int threads() const { return threads_; }

  void set_threads(int n) {
    threads_ = n < 1 ? 1 : n;
    while (int(workers_.size()) < threads_ - 1) {
      const int id = int(workers_.size()) + 1;
      const uint64_t now = generation_;  // a new worker must not miss a job started before it runs
      workers_.emplace_back([this, id, now] { work(id, now); });
    }
  }

  void run(int parts, const std::function<void(int)>& part) {
    {
      std::lock_guard<std::mutex> lock(m_);
      job_ = &part;
      parts_ = parts;
      pending_ = parts - 1;
      ++generation_;
    }
    wake_.notify_all();
    t_in_parts = true;
    part(0);
    t_in_parts = false;
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void work(int id, uint64_t seen) {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= parts_) continue;
      const std::function<void(int)>* job = job_;
      lock.unlock();
      t_in_parts = true;
      (*job)(id);
      t_in_parts = false;
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int threads_ = 1, parts_ = 0, pending_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void ensure_openblas_thread_timeout(char** argv) {
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT")) return;
  // The executable's own path, not /proc/self/exe: the process is named after the file it
  // executes, and ps, pkill and the job scripts look for "meshmoe".
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return;  // no /proc: OpenBLAS's default timeout
  self[n] = '\0';
  setenv("OPENBLAS_THREAD_TIMEOUT", kOpenblasThreadTimeout, 1);
  execv(self, argv);  // returns only on failure (the file replaced or gone): OpenBLAS's default then
}

int host_loop_threads() { return pool().threads(); }
void set_host_loop_threads(int threads) { pool().set_threads(threads); }
bool in_host_parts() { return t_in_parts; }

int requested_run_threads(int64_t threads) {
  if (threads > 0) return int(threads);
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  return env && std::atoi(env) > 0 ? std::atoi(env) : 1;
}

int apply_run_threads(int64_t threads) {
  const int n = requested_run_threads(threads);
  openblas_set_num_threads(n);
  set_host_loop_threads(n);  // the element-wise host loops use the same cores (tensor/launch.hpp)
  return openblas_get_num_threads();
}

void set_blas_threads_for_tasks(bool tasks_running) {
  if (tasks_running) {
    g_saved_blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
  } else {
    openblas_set_num_threads(g_saved_blas_threads);
  }
}

bool host_loop_reversed() { return g_reversed; }
void set_host_loop_reversed(bool reversed) { g_reversed = reversed; }

void run_host_parts(int parts, const std::function<void(int)>& part) {
  if (parts > host_loop_threads()) throw std::logic_error("run_host_parts: more parts than host threads");
  if (parts <= 1 || t_in_parts) {
    for (int p = 0; p < parts; ++p) part(p);
    return;
  }
  pool().run(parts, part);
}

}  // namespace meshmoe
