/*
 * hp_auto_resume: `srun --auto-resume=N` on hp clusters (a SPANK plugin, plugstack.conf).
 *
 * A step started with --auto-resume=N inside a job allocation is run again, up to N
 * times, when it ends after losing a node to a fault. How it tells a fault from the
 * program's own failure: Slurm removes a node from a running job only when that node
 * fails (a job that keeps running on node failure: Slurm's --no-kill, which hp's
 * cli_filter.lua gives a batch job whose script uses --auto-resume). So a step that ends
 * non-zero while its job lost nodes lost them to a fault (the container died or froze,
 * slurmd stopped answering, or hp replaced or rebooted the node after a failed health
 * check or an Action:Replace / Action:Reboot request); a step that ends non-zero with
 * every node still in the job failed by itself (its exit code, a cancel of the step, a
 * time limit) and is not retried.
 *
 * The retry: once the nodes it lost are idle again (hp brings a node back under its
 * name; waited for half of --auto-resume-timeout, at most 30 s), the job is grown back to
 * its size with a job that expands it by those nodes, or by any when they did not come
 * (salloc --dependency=expand:JOB, SchedulerParameters=permit_job_expansion), which Slurm
 * starts at its submission or waits for healthy nodes, within --auto-resume-timeout
 * seconds (default 600); then the step is started again, with the same arguments and
 * HP_AUTO_RESUME_ATTEMPT=<attempt> in its environment, so that a script can resume from
 * its last checkpoint. A retry that cannot launch on the job grown back (Slurm 24.11
 * keeps an expanded job's old node addresses: see grow) requeues the job: it runs again
 * from the top of its script, its steps from their checkpoints.
 *
 * How: srun itself becomes the supervisor (slurm_spank_init_post_opt, before srun
 * starts any thread): it runs the step as a child srun (this srun's own binary and
 * arguments, HP_AUTO_RESUME_CHILD set: the plugin does nothing more there but report
 * the step's id), waits for it, and decides. Slurm is asked through its commands
 * (squeue, scontrol, salloc), never a user string through a shell.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(hp_auto_resume, 1);

#define MAX_RETRIES 100
#define MAX_TIMEOUT_S 86400
#define OUT_MAX 65536

static int retries = -1;        /* -1: --auto-resume not given */
static int timeout_s = 600;     /* --auto-resume-timeout */
static volatile pid_t child = 0; /* the step's srun, while it runs */

static int parse_count(const char *arg, int max, long *out)
{
	char *end = NULL;
	long v;

	if (!arg || !*arg)
		return -1;
	for (const char *p = arg; *p; p++)
		if (*p < '0' || *p > '9')
			return -1;
	errno = 0;
	v = strtol(arg, &end, 10);
	if (errno || *end || v < 0 || v > max)
		return -1;
	*out = v;
	return 0;
}

static int opt_retries(int val, const char *arg, int remote)
{
	long v;

	if (parse_count(arg, MAX_RETRIES, &v)) {
		slurm_error("hp: --auto-resume=%s: give the number of times a step runs again after it loses "
			    "a node to a fault, a whole number from 0 to %d (HyperPod's --auto-resume=1)",
			    arg ? arg : "", MAX_RETRIES);
		return -1;
	}
	retries = (int) v;
	return 0;
}

static int opt_timeout(int val, const char *arg, int remote)
{
	long v;

	if (parse_count(arg, MAX_TIMEOUT_S, &v) || v == 0) {
		slurm_error("hp: --auto-resume-timeout=%s: give the seconds a retry waits for healthy nodes, "
			    "a whole number from 1 to %d (default 600)", arg ? arg : "", MAX_TIMEOUT_S);
		return -1;
	}
	timeout_s = (int) v;
	return 0;
}

static struct spank_option options[] = {
	{ "auto-resume", "N",
	  "hp: run the step again, up to N times, when it loses a node to a fault (a node hp "
	  "brings back or replaces); the program's own exit code, a cancel or a time limit is not retried",
	  1, 0, opt_retries },
	{ "auto-resume-timeout", "SECONDS",
	  "hp: how long a retry waits for healthy nodes to join the job again (default 600)",
	  1, 0, opt_timeout },
	SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();

	if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE)
		return 0;
	for (struct spank_option *o = options; o->name; o++)
		if (spank_option_register(sp, o) != ESPANK_SUCCESS)
			return -1;
	return 0;
}

/* -- running Slurm's commands ------------------------------------------------------ */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Run argv (no shell), its stdout (and, with err_too, stderr) into out; kill it after
 * limit_s. Returns its exit code, or -1. `on_line` sees the output as it comes. */
static int run(char *const argv[], char *out, size_t outlen, int err_too, double limit_s,
	       int (*on_line)(const char *buf, void *arg), void *arg)
{
	int fds[2], status = 0;
	size_t used = 0;
	pid_t pid;
	double end = now_s() + limit_s;

	if (outlen)
		out[0] = '\0';
	if (pipe(fds))
		return -1;
	pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);
		sigset_t none;

		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		dup2(null, 0);
		dup2(fds[1], 1);
		dup2(err_too ? fds[1] : null, 2);
		close(fds[0]);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(fds[1]);
	for (;;) {
		struct pollfd p = { .fd = fds[0], .events = POLLIN };
		double left = end - now_s();
		int r;

		if (left <= 0) {
			kill(pid, SIGTERM);
			break;
		}
		r = poll(&p, 1, (int) (left * 1000) + 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			continue;
		{
			char buf[4096];
			ssize_t n = read(fds[0], buf, sizeof(buf));

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			if (outlen && used + 1 < outlen) {
				size_t k = (size_t) n < outlen - 1 - used ? (size_t) n : outlen - 1 - used;
				memcpy(out + used, buf, k);
				used += k;
				out[used] = '\0';
			}
			if (on_line && on_line(out, arg))
				break;
		}
	}
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void chomp(char *s)
{
	size_t n = strlen(s);

	while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
		s[--n] = '\0';
}

struct job {
	int nodes;
	char nodelist[4096];
	char partition[256];
	char account[256];
	char qos[256];
};

/* The job's current allocation, from squeue. */
static int job_now(const char *jobid, struct job *j)
{
	char out[OUT_MAX];
	char *argv[] = { "squeue", "-h", "-j", (char *) jobid, "-o", "%D|%N|%P|%a|%q", NULL };
	char *f[5] = { 0 }, *s, *save = NULL;
	int i = 0;

	if (run(argv, out, sizeof(out), 0, 30, NULL, NULL) != 0)
		return -1;
	chomp(out);
	for (s = strtok_r(out, "|", &save); s && i < 5; s = strtok_r(NULL, "|", &save))
		f[i++] = s;
	if (i < 3)
		return -1;
	j->nodes = atoi(f[0]);
	snprintf(j->nodelist, sizeof(j->nodelist), "%s", f[1]);
	snprintf(j->partition, sizeof(j->partition), "%s", f[2]);
	snprintf(j->account, sizeof(j->account), "%s", i > 3 ? f[3] : "");
	snprintf(j->qos, sizeof(j->qos), "%s", i > 4 ? f[4] : "");
	return 0;
}

/* A hostlist (cpu-[1-2]) as names, one a line, into out. */
static int hostnames(const char *list, char *out, size_t len)
{
	char *argv[] = { "scontrol", "show", "hostnames", (char *) list, NULL };

	out[0] = '\0';
	if (!*list || !strcmp(list, "(null)"))
		return 0;
	return run(argv, out, len, 0, 30, NULL, NULL) == 0 ? 0 : -1;
}

/* Names in `before` (one a line) that are not in the hostlist `after`, space separated. */
static int lost_nodes(const char *before, const char *after, char *lost, size_t len)
{
	char b[OUT_MAX], a[OUT_MAX];
	char *s, *save = NULL;
	int n = 0;

	lost[0] = '\0';
	snprintf(b, sizeof(b), "%s", before);
	if (hostnames(after, a, sizeof(a)))
		return -1;
	for (s = strtok_r(b, "\n", &save); s; s = strtok_r(NULL, "\n", &save)) {
		char *hit = strstr(a, s);
		size_t k = strlen(s);

		while (hit && !((hit == a || hit[-1] == '\n') && (hit[k] == '\n' || hit[k] == '\0')))
			hit = strstr(hit + 1, s);
		if (hit)
			continue;
		if (strlen(lost) + k + 2 < len) {
			if (n++)
				strcat(lost, " ");
			strcat(lost, s);
		}
	}
	return n;
}

/* Why a node was lost: hp's note on the job (AdminComment "hp: <node> <what hp did>:
 * <why>", written by hp before it takes a node that holds jobs), else the node's Slurm
 * Reason, else that it left the job. */
static void node_reason(const char *jobid, const char *node, char *why, size_t len)
{
	char out[OUT_MAX], key[300];
	char *jargv[] = { "scontrol", "show", "job", (char *) jobid, NULL }; /* a line "AdminComment=..." */
	char *argv[] = { "scontrol", "show", "node", (char *) node, "-o", NULL };
	char *r;

	snprintf(why, len, "lost from the job");
	snprintf(key, sizeof(key), "AdminComment=hp: %s ", node);
	if (run(jargv, out, sizeof(out), 0, 30, NULL, NULL) == 0 && (r = strstr(out, key))) {
		r += strlen(key);
		r[strcspn(r, "\n")] = '\0';
		chomp(r);
		snprintf(why, len, "%s", r);
		return;
	}
	if (run(argv, out, sizeof(out), 0, 30, NULL, NULL) != 0)
		return;
	r = strstr(out, " Reason=");
	if (!r)
		return;
	r += 8;
	{
		char *e = strstr(r, " [");

		if (!e)
			e = r + strcspn(r, "\n");
		snprintf(why, len, "%.*s", (int) (e - r < (long) len - 1 ? e - r : (long) len - 1), r);
	}
}

struct granted {
	char id[32];
};

static int saw_grant(const char *buf, void *arg)
{
	struct granted *g = arg;
	const char *keys[] = { "Granted job allocation ", "Pending job allocation ", NULL };

	for (int i = 0; keys[i]; i++) {
		const char *p = strstr(buf, keys[i]);

		if (p) {
			p += strlen(keys[i]);
			snprintf(g->id, sizeof(g->id), "%.*s", (int) strspn(p, "0123456789"), p);
		}
	}
	return 0; /* read on to its end: salloc --no-shell exits by itself once granted */
}

/* The lost nodes (a hostlist) that are idle now (sinfo, one line a node), or -1. */
static int idle_of(const char *nodes)
{
	char out[OUT_MAX];
	char *argv[] = { "sinfo", "-h", "-N", "-t", "idle", "-o", "%N", "-n", (char *) nodes, NULL };
	int n = 0;

	if (run(argv, out, sizeof(out), 0, 30, NULL, NULL) != 0)
		return -1;
	for (char *s = out; *s; s++)
		if (*s == '\n')
			n++;
	return n;
}

/* Until the `count` lost nodes (a hostlist) are idle again, polled every 0.1 s for at
 * most limit_s (hp brings a node back under its name); 1 when they are. Slurm tries a
 * new job at its submission, then only in its scheduling passes (sched_interval): a node
 * back as a new dynamic node starts none, so a job that expands another, submitted
 * before the node came back, waited up to 2 s more for a pass. */
static int wait_idle(const char *lost, int count, double limit_s)
{
	double end = now_s() + limit_s;
	struct timespec pause = { 0, 100 * 1000 * 1000 };

	for (;;) {
		int n = idle_of(lost);

		if (n >= count)
			return 1;
		if (n < 0 || now_s() >= end)
			return 0;
		nanosleep(&pause, NULL);
	}
}

/* Grow job `jobid` by `count` nodes (a job that expands it): the very nodes it lost
 * (`lost`, comma separated) once hp brought them back, else any; 0 on success.
 * Why the same nodes: Slurm 24.11 keeps an expanded job's node addresses from before
 * (a step's launch for a node that joined goes to the address of the one that left:
 * "Invalid node name specified"); a node back under its name has its address back. */
static int grow(const char *jobid, const struct job *j, const char *lost, int count, const char *note, char *why,
		size_t len)
{
	char n[16], dep[64], tmp[] = "/tmp/hp-auto-resume-XXXXXX", out[OUT_MAX], cwd[PATH_MAX], comment[1100];
	char upd_b[64], upd_j[64];
	struct granted g = { "" };
	char *argv[24];
	int k = 0, rc;

	snprintf(n, sizeof(n), "%d", count);
	snprintf(dep, sizeof(dep), "expand:%s", jobid);
	argv[k++] = "salloc";
	argv[k++] = "--no-shell";
	argv[k++] = "-N";
	argv[k++] = n;
	argv[k++] = "--dependency";
	argv[k++] = dep;
	/* hp's agent records each retry as an event from this job's name and comment */
	snprintf(comment, sizeof(comment), "--comment=%s", note);
	argv[k++] = "-J";
	argv[k++] = "hp-auto-resume";
	argv[k++] = comment;
	if (*j->partition) {
		argv[k++] = "-p";
		argv[k++] = (char *) j->partition;
	}
	if (*j->account && strcmp(j->account, "(null)")) {
		argv[k++] = "-A";
		argv[k++] = (char *) j->account;
	}
	if (*j->qos && strcmp(j->qos, "(null)") && strcmp(j->qos, "normal")) {
		argv[k++] = "-q";
		argv[k++] = (char *) j->qos;
	}
	{
		double t0 = now_s(), left;
		double limit = timeout_s / 2.0 < 30 ? timeout_s / 2.0 : 30; /* the rest: salloc's own wait */

		if (wait_idle(lost, count, limit)) {
			argv[k++] = "-w";
			argv[k++] = (char *) lost;
		}
		argv[k] = NULL;
		left = timeout_s - (now_s() - t0);
		rc = run(argv, out, sizeof(out), 1, left > 1 ? left : 1, saw_grant, &g);
	}
	if (rc != 0 || !strstr(out, "Granted job allocation")) {
		if (*g.id) {
			char *cancel[] = { "scancel", g.id, NULL };

			run(cancel, NULL, 0, 0, 30, NULL, NULL);
		}
		chomp(out);
		snprintf(why, len, "no %d healthy node(s) joined the job within %d s (--auto-resume-timeout)%s%.200s",
			 count, timeout_s, *out ? ": " : "", out);
		return -1;
	}
	/* scontrol writes slurm_job_<id>_resize.{sh,csh} where it runs: in a folder of its own */
	if (!mkdtemp(tmp) || !getcwd(cwd, sizeof(cwd)) || chdir(tmp)) {
		snprintf(why, len, "no temporary folder for scontrol: %s", strerror(errno));
		return -1;
	}
	snprintf(upd_b, sizeof(upd_b), "JobId=%s", g.id);
	snprintf(upd_j, sizeof(upd_j), "JobId=%s", jobid);
	{
		char *give[] = { "scontrol", "update", upd_b, "NumNodes=0", NULL };
		char *take[] = { "scontrol", "update", upd_j, "NumNodes=ALL", NULL };
		char *cancel[] = { "scancel", g.id, NULL };

		rc = run(give, out, sizeof(out), 1, 30, NULL, NULL);
		if (rc == 0)
			rc = run(take, out, sizeof(out), 1, 30, NULL, NULL);
		run(cancel, NULL, 0, 0, 30, NULL, NULL);
	}
	{
		char path[PATH_MAX];
		const char *ext[] = { "sh", "csh", NULL };

		for (int i = 0; ext[i]; i++) {
			snprintf(path, sizeof(path), "%s/slurm_job_%s_resize.%s", tmp, g.id, ext[i]);
			unlink(path);
			snprintf(path, sizeof(path), "%s/slurm_job_%s_resize.%s", tmp, jobid, ext[i]);
			unlink(path);
		}
	}
	if (chdir(cwd)) {
	}
	rmdir(tmp);
	if (rc != 0) {
		chomp(out);
		snprintf(why, len, "the job could not take the new node(s): %.300s", out);
		return -1;
	}
	return 0;
}

/* -- the supervisor ---------------------------------------------------------------- */

static void forward(int sig)
{
	if (child > 0)
		kill(child, sig);
}

static char **own_argv(void)
{
	static char buf[1 << 20];
	static char *argv[4096];
	int fd = open("/proc/self/cmdline", O_RDONLY);
	ssize_t n, used = 0;
	int k = 0;

	if (fd < 0)
		return NULL;
	while ((n = read(fd, buf + used, sizeof(buf) - 1 - used)) > 0)
		used += n;
	close(fd);
	buf[used] = '\0';
	for (ssize_t i = 0; i < used && k < 4095; i += strlen(buf + i) + 1)
		argv[k++] = buf + i;
	argv[k] = NULL;
	return k ? argv : NULL;
}

static void set_env_int(const char *name, int v)
{
	char s[16];

	snprintf(s, sizeof(s), "%d", v);
	setenv(name, s, 1);
}

/* Does srun's line say its step could not be launched on a node? */
static int launch_failure(const char *line)
{
	return (strstr(line, "Task launch for StepId=") && strstr(line, " failed on node ")) ||
	       strstr(line, "Application launch failed");
}

/* One run of the step: its exit status (as a shell reports it); its step id in *step.
 * srun's stderr passes through (line by line, as it comes) so that a launch failure is
 * seen: *launch_failed. */
static int run_step(char **argv, int attempt, char *step, size_t len, int *launch_failed)
{
	int fds[2], errs[2], status = 0, open_fds = 2;
	char buf[64] = "", line[4096];
	ssize_t n, used = 0;
	size_t lused = 0;

	*launch_failed = 0;
	if (pipe(fds))
		return 1;
	if (pipe(errs)) {
		close(fds[0]);
		close(fds[1]);
		return 1;
	}
	child = fork();
	if (child < 0) {
		child = 0;
		return 1;
	}
	if (child == 0) {
		char fd[16];
		sigset_t none;

		close(fds[0]);
		close(errs[0]);
		dup2(errs[1], 2);
		close(errs[1]);
		snprintf(fd, sizeof(fd), "%d", fds[1]);
		setenv("HP_AUTO_RESUME_CHILD", fd, 1);
		set_env_int("HP_AUTO_RESUME_ATTEMPT", attempt);
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	close(fds[1]);
	close(errs[1]);
	while (open_fds) {
		struct pollfd p[2] = { { .fd = fds[0], .events = POLLIN }, { .fd = errs[0], .events = POLLIN } };
		char chunk[4096];

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[0].revents && p[0].fd >= 0) {
			n = read(fds[0], buf + used, sizeof(buf) - 1 - used);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0 || used + n >= (ssize_t) sizeof(buf) - 1) {
				if (n > 0)
					used += n;
				close(fds[0]);
				fds[0] = -1;
				open_fds--;
			} else {
				used += n;
			}
		}
		if (p[1].revents && errs[0] >= 0) {
			n = read(errs[0], chunk, sizeof(chunk));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				close(errs[0]);
				errs[0] = -1;
				open_fds--;
				continue;
			}
			if (write(2, chunk, n) < 0) {
			}
			for (ssize_t i = 0; i < n; i++) {
				if (chunk[i] == '\n' || lused + 1 >= sizeof(line)) {
					line[lused] = '\0';
					if (launch_failure(line))
						*launch_failed = 1;
					lused = 0;
				} else {
					line[lused++] = chunk[i];
				}
			}
		}
	}
	if (fds[0] >= 0)
		close(fds[0]);
	if (errs[0] >= 0)
		close(errs[0]);
	buf[used] = '\0';
	while (waitpid(child, &status, 0) < 0 && errno == EINTR)
		;
	child = 0;
	chomp(buf);
	snprintf(step, len, "%s", *buf ? buf : "?");
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* The job, grown back, cannot launch its step (Slurm 24.11: see grow): requeue it, so it
 * runs again from the top of its script, its --auto-resume steps from their checkpoints.
 * The requeue ends this srun with the job; returns only when Slurm refused it. */
static void requeue_self(const char *jobid)
{
	char out[OUT_MAX];
	char *argv[] = { "scontrol", "requeue", (char *) jobid, NULL };

	if (run(argv, out, sizeof(out), 1, 30, NULL, NULL) != 0) {
		chomp(out);
		fprintf(stderr, "hp: job %s could not be requeued: %.300s\n", jobid, out);
		return;
	}
	for (int i = 0; i < 600; i++) /* until the requeue ends this srun */
		sleep(1);
}

static void supervise(void)
{
	const char *jobid = getenv("SLURM_JOB_ID");
	char **argv = own_argv();
	struct job before, after;
	struct sigaction sa;
	sigset_t fwd;
	int attempt = 0, rc, launch_failed;

	if (!argv) {
		slurm_error("hp: --auto-resume: cannot read srun's own arguments; the step runs once");
		return;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = forward;
	sigemptyset(&fwd);
	for (int s = 0, sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, 0 }; sigs[s]; s++) {
		sigaction(sigs[s], &sa, NULL);
		sigaddset(&fwd, sigs[s]);
	}
	sigprocmask(SIG_UNBLOCK, &fwd, NULL);

	for (;;) {
		char step[32], lost[4096], why[512], first[256], note[1024], names[OUT_MAX];
		double t_end;

		/* the job's nodes, by name, before the step: not on the path of a retry */
		if (job_now(jobid, &before) || hostnames(before.nodelist, names, sizeof(names))) {
			slurm_error("hp: --auto-resume: squeue does not answer for job %s; the step runs once", jobid);
			before.nodes = -1;
		}
		rc = run_step(argv, attempt, step, sizeof(step), &launch_failed);
		if (rc == 0 || before.nodes < 0)
			_exit(rc);
		if (launch_failed && attempt > 0) {
			fprintf(stderr,
				"hp: step %s of job %s could not start on the job grown back (its nodes' addresses are "
				"Slurm's from before); the job is requeued and runs again from the top of its script\n",
				step, jobid);
			fflush(stderr);
			requeue_self(jobid);
			_exit(rc);
		}
		t_end = now_s();
		if (job_now(jobid, &after) || after.nodes >= before.nodes ||
		    lost_nodes(names, after.nodelist, lost, sizeof(lost)) <= 0)
			_exit(rc); /* every node still in the job: the program's own failure */
		snprintf(first, sizeof(first), "%.*s", (int) strcspn(lost, " "), lost);
		node_reason(jobid, first, why, sizeof(why));
		if (attempt >= retries) {
			fprintf(stderr,
				"hp: step %s of job %s lost %s (%s): not retried, %d of %d retries used (--auto-resume=%d)\n",
				step, jobid, lost, why, attempt, retries, retries);
			_exit(rc);
		}
		attempt++;
		snprintf(note, sizeof(note), "hp-auto-resume job=%s step=%s lost=%s attempt=%d of %d: %s", jobid,
			 step, lost, attempt, retries, why);
		fprintf(stderr, "hp: retrying step %s of job %s after %s failed (%s), attempt %d of %d\n",
			step, jobid, lost, why, attempt, retries);
		fflush(stderr);
		for (char *c = lost; *c; c++) /* a hostlist for sinfo and salloc */
			if (*c == ' ')
				*c = ',';
		if (grow(jobid, &before, lost, before.nodes - after.nodes, note, why, sizeof(why))) {
			fprintf(stderr, "hp: step %s of job %s not retried: %s\n", step, jobid, why);
			_exit(rc);
		}
		if (job_now(jobid, &after) == 0) {
			setenv("SLURM_JOB_NODELIST", after.nodelist, 1);
			setenv("SLURM_NODELIST", after.nodelist, 1);
			set_env_int("SLURM_JOB_NUM_NODES", after.nodes);
			set_env_int("SLURM_NNODES", after.nodes);
		}
		fprintf(stderr, "hp: job %s has %d node(s) again (%s) after %.1f s; step starts again\n", jobid,
			after.nodes, after.nodelist, now_s() - t_end);
		fflush(stderr);
	}
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	if (spank_context() != S_CTX_LOCAL || retries < 0 || getenv("HP_AUTO_RESUME_CHILD"))
		return 0;
	if (!getenv("SLURM_JOB_ID")) {
		slurm_error("hp: --auto-resume runs a step again inside its job: use it in a job allocation "
			    "(an sbatch script, or salloc --no-kill)");
		return -1;
	}
	supervise(); /* returns only when the step cannot be supervised: srun goes on as usual */
	return 0;
}

/* In the step's own srun: tell the supervisor which step this is. */
int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
	const char *fd = getenv("HP_AUTO_RESUME_CHILD");
	uint32_t step = 0;
	char s[32];
	int n;

	if (spank_context() != S_CTX_LOCAL || !fd)
		return 0;
	n = atoi(fd);
	if (n > 2 && spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS) {
		snprintf(s, sizeof(s), "%u\n", step);
		if (write(n, s, strlen(s)) < 0) {
		}
	}
	if (n > 2)
		close(n);
	unsetenv("HP_AUTO_RESUME_CHILD");
	return 0;
}
