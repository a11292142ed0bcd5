// Work items [0, items) shared by a team of threads that claim them one at a time.
//
// Thread t owns range t of an even split and takes its items from the front, in order
// (so a thread's items follow one another in memory, as with a static split, and
// hardware prefetchers keep streaming across them); once its own range is empty it takes
// the last item of the first other range that still holds one. A thread the OS delays
// (other processes share the cores) then holds up only the item it is running, not the
// rest of its share, which the others finish: an op of a static split waits at its end
// for the delayed thread's whole share.
//
// Invariant: every item is handed out exactly once. A range is one 64-bit word
// (front << 32 | back), changed only by compare-and-swap, so an owner's take from the front
// and a thief's take from the back never hand out the same item.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace paged_core_cpu {

class ClaimedRanges {
 public:
  ClaimedRanges(int64_t items, int threads) : threads_(threads), ranges_(new Range[threads]) {
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

}  // namespace paged_core_cpu
