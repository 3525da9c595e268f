// Clang thread-safety annotations (-Wthread-safety), after
// https://clang.llvm.org/docs/ThreadSafetyAnalysis.html. They document which
// mutex guards a member and which locks a function needs, and clang checks
// it at compile time; on other compilers they expand to nothing. Use them with
// the annotated Mutex of common/mutex.h (libstdc++'s std::mutex carries no
// capability attribute).
#pragma once

#if defined(__clang__)
#define ORBITKV_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define ORBITKV_THREAD_ANNOTATION(x)
#endif

// A type that is a lock ("mutex").
#define CAPABILITY(x) ORBITKV_THREAD_ANNOTATION(capability(x))
// An RAII type that holds a lock for its lifetime.
#define SCOPED_CAPABILITY ORBITKV_THREAD_ANNOTATION(scoped_lockable)
// A member that may only be touched with the lock held.
#define GUARDED_BY(x) ORBITKV_THREAD_ANNOTATION(guarded_by(x))
// A pointer member whose pointee may only be touched with the lock held.
#define PT_GUARDED_BY(x) ORBITKV_THREAD_ANNOTATION(pt_guarded_by(x))
// Lock order: this lock is taken before / after the named ones.
#define ACQUIRED_BEFORE(...) ORBITKV_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) ORBITKV_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
// The caller must hold / must not hold the locks.
#define REQUIRES(...) ORBITKV_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) ORBITKV_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function takes / releases the locks.
#define ACQUIRE(...) ORBITKV_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) ORBITKV_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) ORBITKV_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// The function returns a reference to the named lock.
#define RETURN_CAPABILITY(x) ORBITKV_THREAD_ANNOTATION(lock_returned(x))
// Asserts (to the analysis) that the lock is held.
#define ASSERT_CAPABILITY(x) ORBITKV_THREAD_ANNOTATION(assert_capability(x))
// Opts a function out of the analysis; say why next to it.
#define NO_THREAD_SAFETY_ANALYSIS ORBITKV_THREAD_ANNOTATION(no_thread_safety_analysis)
