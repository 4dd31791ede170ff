/* The kernels' thread pool (threads.c) and per-thread scratch buffers. */
#ifndef PG_THREADS_H
#define PG_THREADS_H

#include <stdint.h>

typedef void (*TaskFn)(void *ctx, int64_t task);

/* Runs fn(ctx, 0 .. num_tasks - 1) on the calling thread and up to num_threads - 1 helpers;
 * returns when every task is done. Tasks must not depend on which thread runs them. */
void pg_parallel(int num_threads, int64_t num_tasks, TaskFn fn, void *ctx);

/* A buffer of at least `count` floats belonging to the calling thread (slot 0..3), kept for its
 * next call. */
float *pg_scratch(int slot, int64_t count);

#endif
