// CpuRelax: one iteration of a spin-wait loop's body (the x86 PAUSE / Arm
// YIELD hint: less power, and no memory-order mis-speculation penalty when
// the awaited store lands). Never blocks; callers bound their own spins.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace orbitkv {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace orbitkv
