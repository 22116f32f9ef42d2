/* daemon/io/worker.h — a small thread pool whose completions come back to the
 * event loop.
 *
 * Work that may block or burn CPU (pread/pwrite/fsync when io_uring is
 * unavailable, XXH3 over gigabytes, checkpoint writes) runs as a struct
 * worker_job on one of a few threads; its done() then runs on the loop
 * thread, in the same turn as any other completion. Finished jobs are put
 * on a mutex-protected list and an eventfd is written; the loop reads that
 * eventfd through its ring (a struct loop_op), runs every finished job's
 * done() and reads again. The loop thread holds the mutex only to splice a
 * list, never while a job runs.
 *
 * Threading: worker_init, worker_submit and worker_fini are called on the
 * loop thread, and done() runs there; run() runs on a worker thread, with
 * every signal blocked (the daemon takes SIGTERM/SIGINT/SIGHUP through a
 * signalfd, which only works when no thread accepts them).
 */
#ifndef KVPD_WORKER_H
#define KVPD_WORKER_H

#include <pthread.h>
#include <stdint.h>

#include "loop.h"

#define WORKER_MAX_THREADS 64u

struct worker_job {
	/* On a worker thread; may block. Touches only what the job owns. */
	void (*run)(struct worker_job *j);
	/* Then on the loop thread. May free the job or submit it again. */
	void (*done)(struct worker_job *j);
	struct worker_job *next; /* private */
};

struct worker {
	struct loop *loop; /* NULL: not set up, or finished */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct worker_job *todo, **todo_tail;	 /* mu: submitted, not yet run */
	struct worker_job *finished, **fin_tail; /* mu: run, done() not yet called */
	int stopping;				 /* mu: threads exit once todo is empty */
	pthread_t *threads;
	unsigned int n_threads;
	int efd;	  /* eventfd: finished became non-empty */
	uint64_t efd_val; /* target of the read in the ring */
	struct loop_op op;
	unsigned int n_pending; /* loop thread: submitted, done() not yet run */
};

/* Starts n_threads threads (1..WORKER_MAX_THREADS), all signals blocked,
 * and queues the eventfd read on l (it starts when the loop next turns).
 * On failure nothing is left running and worker_fini is a no-op. Returns
 * 0, -EINVAL (n_threads), or -errno from eventfd or
 * pthread_create (-EAGAIN, -ENOMEM, -EMFILE). */
int worker_init(struct worker *w, struct loop *l, unsigned int n_threads);

/* Queues j; j->run runs on some worker thread, then j->done on the loop
 * thread, from the loop's completion of the eventfd read (never from
 * inside worker_submit). Jobs run in no guaranteed order. j must stay
 * valid until its done() is called. Loop thread only. During worker_fini
 * (from a done() it calls) the job runs at once on the calling thread. */
void worker_submit(struct worker *w, struct worker_job *j);

/* Shuts the pool down: every job already submitted still runs (fini
 * waits for them; the loop need not turn), the threads are joined, and
 * then the done() of every job runs here, on the calling (loop) thread.
 * Call it after loop_run returned. It submits whatever the ring has
 * queued (so the eventfd read holds its file before the descriptor is
 * closed; an epoll loop forgets the read instead); the ring keeps that
 * read, pointing into w, until loop_fini, so w's memory must stay valid
 * until then (should the loop run again, the read's completion is
 * ignored). Safe on a worker whose init failed, and twice. */
void worker_fini(struct worker *w);

#endif
