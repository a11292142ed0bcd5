// Work items [0, items) shared by a team of threads that claim them one at a time.
//
// Thread t owns range t of an even split and takes its items from the front, in order
// (so a thread's items follow one another in memory, as with a static split, and
// hardware prefetchers keep streaming across them); once its own range is empty it takes
// the last item of the first other range that still holds one. A thread the OS delays
// (other processes share the cores) then holds up only the item it is running, not the
// rest of its share, which the others finish: an op of a static split waits at its end
// for the delayed thread's whole share. (SmolLM2 in bfloat16, steps of 8 x 256 prompt tokens
// beside a process busy 2 ms of every 12 on one core: 588-606 ms against 661-693 with
// at::parallel_for's static split; 545-546 against 549-569 ms on a quiet machine; AMD EPYC
// Zen 5, avx512_bf16. A burst of 100 requests through the LitServe adapter, whose HTTP and
// queue threads share the cores, went from TTFT p99 3.18 s to 2.54 s with SiLU-and-mul
// fused at the same time: benchmarks/results/serve_zen5_claimed.)
//
// Invariant: every item is handed out exactly once. A range is one 64-bit word
// (front << 32 | back), changed only by compare-and-swap, so an owner's take from the front
// and a thief's take from the back never hand out the same item.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace paged_core_cpu {

class ClaimedRanges {
 public:
  ClaimedRanges(int64_t items, int threads) : threads_(threads), ranges_(new Range[threads]) {
    TORCH_CHECK(items >= 0 && items < (int64_t{1} << 32), "a range word holds 32-bit item indices, got ",
                items, " items");
    for (int t = 0; t < threads; ++t)
      ranges_[t].word.store(pack(items * t / threads, items * (t + 1) / threads),
                            std::memory_order_relaxed);
  }

  // The next item for thread t (0 <= t < threads), or -1 once every item is taken.
  int64_t take(int t) {
    const int64_t own = take_one(ranges_[t].word, /*from_front=*/true);
    if (own >= 0) return own;
    for (int k = 1; k < threads_; ++k) {
      const int64_t stolen = take_one(ranges_[(t + k) % threads_].word, /*from_front=*/false);
      if (stolen >= 0) return stolen;
    }
    return -1;
  }

 private:
  struct alignas(64) Range {  // a cache line each: owners claim without sharing lines
    std::atomic<uint64_t> word{0};
  };

  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(back);
  }

  static int64_t take_one(std::atomic<uint64_t>& word, bool from_front) {
    uint64_t seen = word.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = static_cast<int64_t>(seen >> 32);
      const int64_t back = static_cast<int64_t>(seen & 0xFFFFFFFFu);
      if (front >= back) return -1;
      const uint64_t next = from_front ? pack(front + 1, back) : pack(front, back - 1);
      if (word.compare_exchange_weak(seen, next, std::memory_order_relaxed))
        return from_front ? front : back - 1;
    }
  }

  int threads_;
  std::unique_ptr<Range[]> ranges_;
};

// Runs thread_body(claims, t) on each thread t of a team of min(at::get_num_threads(), items)
// threads (one inside another parallel region; none for no items), claims shared over
// [0, items). A body takes its items with claims.take(t) until it gets -1; it must not throw.
template <typename ThreadBody>
void run_claiming(int64_t items, ThreadBody&& thread_body) {
  if (items <= 0) return;
  const int threads = at::in_parallel_region()
                          ? 1 : static_cast<int>(std::min<int64_t>(at::get_num_threads(), items));
  ClaimedRanges claims(items, threads);
#pragma omp parallel num_threads(threads)
  thread_body(claims, omp_get_thread_num());
}

}  // namespace paged_core_cpu
