/* daemon/io/worker.c — the worker thread pool (see worker.h).
 *
 * Two singly linked FIFO lists under one mutex: todo (submitted) and
 * finished (run, waiting for done()). A thread that appends to an empty
 * finished list writes the eventfd; the loop's read completion splices
 * the whole list out under the mutex and runs the done() callbacks with
 * the mutex released. Any append to an empty list is followed by a write,
 * so no completion waits for a later one; a spurious wake-up finds an
 * empty list and costs one read.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "list.h"
#include "log.h"
#include "worker.h"

static void arm_read(struct worker *w)
{
	loop_read(w->loop, &w->op, w->efd, &w->efd_val, sizeof(w->efd_val));
}

/* Takes the finished list (FIFO order); the mutex is held for a splice. */
static struct worker_job *take_finished(struct worker *w)
{
	struct worker_job *list;

	pthread_mutex_lock(&w->mu);
	list = w->finished;
	w->finished = NULL;
	w->fin_tail = &w->finished;
	pthread_mutex_unlock(&w->mu);
	return list;
}

/* Runs done() for every job on list. A done() may submit its job again
 * (which rewrites next), so next is read first. */
static void run_done(struct worker *w, struct worker_job *list)
{
	while (list) {
		struct worker_job *j = list;

		list = j->next;
		kvp_assert(w->n_pending > 0);
		w->n_pending--;
		j->done(j);
	}
}

static void on_eventfd(struct loop_op *op, int res, unsigned int flags)
{
	struct worker *w = container_of(op, struct worker, op);

	(void)flags;
	(void)res;
	if (!w->loop)
		return; /* after worker_fini */
	/* Whatever the read says (it cannot fail on an eventfd; -ECANCELED
	 * only when someone cancels it), the list is looked at and the read
	 * armed again: a completion must never wait for a later one. */
	run_done(w, take_finished(w));
	arm_read(w);
}

/* Appends j to the finished list; returns 1 when the list was empty, so
 * the caller must wake the loop. */
static int put_finished(struct worker *w, struct worker_job *j)
{
	int was_empty;

	j->next = NULL;
	pthread_mutex_lock(&w->mu);
	was_empty = !w->finished;
	*w->fin_tail = j;
	w->fin_tail = &j->next;
	pthread_mutex_unlock(&w->mu);
	return was_empty;
}

static void *thread_main(void *arg)
{
	struct worker *w = arg;

	for (;;) {
		struct worker_job *j;

		pthread_mutex_lock(&w->mu);
		while (!w->todo && !w->stopping)
			pthread_cond_wait(&w->cv, &w->mu);
		j = w->todo;
		if (!j) {
			/* Stopping, and nothing is left to run. */
			pthread_mutex_unlock(&w->mu);
			break;
		}
		w->todo = j->next;
		if (!w->todo)
			w->todo_tail = &w->todo;
		pthread_mutex_unlock(&w->mu);

		j->run(j);
		if (put_finished(w, j) && eventfd_write(w->efd, 1) < 0)
			/* Only EAGAIN at a counter of 2^64-2, never reached. */
			kvp_assert(errno == EAGAIN);
	}
	return NULL;
}

int worker_init(struct worker *w, struct loop *l, unsigned int n_threads)
{
	sigset_t all, old;
	int ret = 0;

	memset(w, 0, sizeof(*w));
	w->efd = -1;
	if (n_threads == 0 || n_threads > WORKER_MAX_THREADS)
		return -EINVAL;
	w->todo_tail = &w->todo;
	w->fin_tail = &w->finished;
	w->op.cb = on_eventfd;
	w->threads = calloc(n_threads, sizeof(*w->threads));
	if (!w->threads)
		return -ENOMEM;
	w->efd = eventfd(0, EFD_CLOEXEC);
	if (w->efd < 0) {
		ret = -errno;
		goto fail_threads;
	}
	ret = -pthread_mutex_init(&w->mu, NULL);
	if (ret < 0)
		goto fail_efd;
	ret = -pthread_cond_init(&w->cv, NULL);
	if (ret < 0)
		goto fail_mu;

	/* Threads inherit the creator's mask: block everything while
	 * creating them, so no signal is ever delivered to a worker, but
	 * for the faults of its own accesses: a blocked SIGBUS would kill
	 * the daemon where guard.h turns one into -EFAULT. */
	sigfillset(&all);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (; w->n_threads < n_threads; w->n_threads++) {
		ret = -pthread_create(&w->threads[w->n_threads], NULL, thread_main, w);
		if (ret < 0)
			break;
		pthread_setname_np(w->threads[w->n_threads], "kvpd-worker");
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret < 0)
		goto fail_join;

	w->loop = l;
	arm_read(w);
	return 0;

fail_join:
	pthread_mutex_lock(&w->mu);
	w->stopping = 1;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	while (w->n_threads > 0)
		pthread_join(w->threads[--w->n_threads], NULL);
	pthread_cond_destroy(&w->cv);
fail_mu:
	pthread_mutex_destroy(&w->mu);
fail_efd:
	close(w->efd);
	w->efd = -1;
fail_threads:
	free(w->threads);
	w->threads = NULL;
	return ret;
}

void worker_submit(struct worker *w, struct worker_job *j)
{
	int stopping;

	kvp_assert(w->loop);
	w->n_pending++;
	j->next = NULL;
	pthread_mutex_lock(&w->mu);
	stopping = w->stopping;
	if (!stopping) {
		*w->todo_tail = j;
		w->todo_tail = &j->next;
		pthread_cond_signal(&w->cv);
	}
	pthread_mutex_unlock(&w->mu);
	if (stopping) {
		/* From a done() inside worker_fini: the threads are gone; run
		 * it here and let worker_fini call its done(). */
		j->run(j);
		put_finished(w, j);
	}
}

void worker_fini(struct worker *w)
{
	struct worker_job *list;
	struct pollfd pfd;
	eventfd_t v;

	if (!w->loop)
		return;
	pthread_mutex_lock(&w->mu);
	w->stopping = 1;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	/* Each thread leaves once the todo list is empty: every job
	 * submitted so far has run when the joins return. */
	while (w->n_threads > 0)
		pthread_join(w->threads[--w->n_threads], NULL);
	free(w->threads);
	w->threads = NULL;

	/* The read may still sit unsubmitted in the SQ, naming the eventfd
	 * by number: hand it to the kernel, which then holds the file, before
	 * the number is closed and perhaps reused (epoll forgets it instead).
	 * Then empty the counter so the read never completes (nothing writes
	 * the eventfd any more). */
	loop_submit(w->loop);
	loop_forget_fd(w->loop, w->efd);
	pfd.fd = w->efd;
	pfd.events = POLLIN;
	if (poll(&pfd, 1, 0) == 1)
		eventfd_read(w->efd, &v);

	/* done() may submit again; such jobs run inline and land here. */
	while ((list = take_finished(w)))
		run_done(w, list);
	kvp_assert(w->n_pending == 0);
	close(w->efd);
	w->efd = -1;
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	w->loop = NULL;
}
