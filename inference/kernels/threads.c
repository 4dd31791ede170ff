/* The kernels' thread pool: `pg_parallel` runs tasks 0..n-1 of a function on the calling thread
 * and up to `num_threads - 1` helper threads.
 *
 * Why not OpenMP: its parallel region ends in a barrier, so a call waits for every thread of the
 * team, including one the OS has not scheduled yet. On a busy machine (the web server, Redis and
 * the worker share a few cores) that wait is a scheduler time slice per call, and a decode step
 * makes ~150 calls: measured 0.8 tok/s against 8.9 on one thread. Here tasks are claimed one at a
 * time from a shared counter and the caller runs them too, so it only ever waits for tasks a
 * helper has already claimed; a helper that was not running finds the job taken and goes back to
 * waiting. Which thread runs a task never changes its result (each output is computed whole by
 * one task), so this is invisible in the numbers.
 *
 * Helpers spin briefly between calls (the calls of a forward pass come tens of microseconds
 * apart), then sleep on a futex. Linux only; elsewhere everything runs on the calling thread.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "threads.h"

float *pg_scratch(int slot, int64_t count) {
    static __thread float *buffers[4];
    static __thread int64_t capacity[4];
    if (count > capacity[slot]) {
        free(buffers[slot]);
        buffers[slot] = (float *)malloc((size_t)count * sizeof(float));
        capacity[slot] = count;
    }
    return buffers[slot];
}

#if defined(__linux__)
#include <linux/futex.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_HELPERS 63
#define SPIN_ROUNDS 20000  // ~50-100 us of pause instructions before a helper sleeps

static struct {
    pthread_mutex_t start_lock;       // guards starting helpers
    int num_started;                  // helpers running (never stopped)
    _Atomic uint64_t claim;           // job generation << 32 | next task index
    _Atomic int64_t num_done;         // tasks of the current job finished
    int64_t num_tasks;                // of the current job (read after a successful claim)
    _Atomic int num_wanted;           // helpers the current job may use
    TaskFn fn;
    void *ctx;
    _Atomic uint32_t wake_seq;        // futex word: bumped at every job
    _Atomic int num_sleeping;
} pool = {.start_lock = PTHREAD_MUTEX_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Claims and runs tasks of job `generation` until none is left. */
static void run_tasks(uint32_t generation) {
    uint64_t current = atomic_load(&pool.claim);
    for (;;) {
        if ((uint32_t)(current >> 32) != generation) return;
        int64_t task = (int64_t)(current & 0xffffffffu);
        if (task >= pool.num_tasks) return;
        if (!atomic_compare_exchange_weak(&pool.claim, &current, current + 1)) continue;
        pool.fn(pool.ctx, task);
        atomic_fetch_add(&pool.num_done, 1);
        current = atomic_load(&pool.claim);
    }
}

static void *helper_main(void *arg) {
    int index = (int)(intptr_t)arg;
    uint32_t seen = 0;
    prctl(PR_SET_NAME, "pg-kernels", 0, 0, 0);  // what top -H and the stack benchmark count as the engine's
    for (;;) {
        uint32_t generation = (uint32_t)(atomic_load(&pool.claim) >> 32);
        if (generation != seen) {
            seen = generation;
            if (index < atomic_load(&pool.num_wanted)) run_tasks(generation);
            continue;
        }
        int spun = 0;
        while ((uint32_t)(atomic_load(&pool.claim) >> 32) == seen && spun++ < SPIN_ROUNDS) cpu_relax();
        if ((uint32_t)(atomic_load(&pool.claim) >> 32) != seen) continue;
        uint32_t seq = atomic_load(&pool.wake_seq);
        atomic_fetch_add(&pool.num_sleeping, 1);
        if ((uint32_t)(atomic_load(&pool.claim) >> 32) == seen)
            syscall(SYS_futex, &pool.wake_seq, FUTEX_WAIT_PRIVATE, seq, NULL, NULL, 0);
        atomic_fetch_sub(&pool.num_sleeping, 1);
    }
    return NULL;
}

static int ensure_helpers(int wanted) {
    if (wanted > MAX_HELPERS) wanted = MAX_HELPERS;
    if (pool.num_started >= wanted) return wanted;
    pthread_mutex_lock(&pool.start_lock);
    while (pool.num_started < wanted) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, helper_main, (void *)(intptr_t)pool.num_started) != 0) break;
        pthread_detach(thread);
        pool.num_started++;
    }
    pthread_mutex_unlock(&pool.start_lock);
    return pool.num_started < wanted ? pool.num_started : wanted;
}

static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;  // one job at a time (several engines)

void pg_parallel(int num_threads, int64_t num_tasks, TaskFn fn, void *ctx) {
    if (num_threads <= 1 || num_tasks <= 1 || pthread_mutex_trylock(&job_lock) != 0) {
        for (int64_t t = 0; t < num_tasks; t++) fn(ctx, t);  // busy pool (another engine's job): alone
        return;
    }
    int helpers = ensure_helpers(num_threads - 1);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.num_tasks = num_tasks;
    atomic_store(&pool.num_done, 0);
    atomic_store(&pool.num_wanted, helpers);
    uint32_t generation = (uint32_t)(atomic_load(&pool.claim) >> 32) + 1;
    atomic_store(&pool.claim, (uint64_t)generation << 32);  // publishes the job
    atomic_fetch_add(&pool.wake_seq, 1);
    if (atomic_load(&pool.num_sleeping) > 0) syscall(SYS_futex, &pool.wake_seq, FUTEX_WAKE_PRIVATE, helpers, NULL, NULL, 0);
    run_tasks(generation);
    while (atomic_load(&pool.num_done) < num_tasks) cpu_relax();  // only tasks a helper already claimed
    pthread_mutex_unlock(&job_lock);
}

#else

void pg_parallel(int num_threads, int64_t num_tasks, TaskFn fn, void *ctx) {
    (void)num_threads;
    for (int64_t t = 0; t < num_tasks; t++) fn(ctx, t);
}

#endif
