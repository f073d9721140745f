/* Closed-loop heartbeat load generator for bench/instances.py: one request in flight per connection, epoll.

   hbload PLAN WARMUP_S SECONDS PIDS

   PLAN is a text file: for each connection a line "PORT COUNT" (a connection to 127.0.0.1:PORT) followed by
   COUNT lines, each one request frame in hex (size prefix included; bytes 8..11 are the correlation id, which
   is rewritten per request). Each connection sends its frames in turn, the next one when the previous answer
   has arrived. After WARMUP_S seconds it counts answers for SECONDS seconds and prints one line of JSON:
   answers (in all and by port), answers carrying an error code (Heartbeat v4: int16 at byte 13), latency p50/p99, its own CPU time
   the CPU time (utime + stime from /proc/PID/stat, all threads) of each process in PIDS (comma-separated,
   "-" for none) and the whole machine's busy CPU time (/proc/stat) over exactly the measured window.

   Why C: the Python load generator costs about 11 us of CPU per heartbeat, as much as the servers under test,
   and here it shares their two cores; this one costs a few us (mostly the kernel's send and receive). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_LATENCIES 8000000
#define MAX_PIDS 16
#define READ_BUFFER 4096
#define MAX_PORTS 16

struct conn {
    int fd;
    int port;
    int port_index; /* into the answers-by-port table */
    int nframes;
    int next;
    int open;
    unsigned char **frames;
    int *lengths;
    int received;
    uint64_t sent_ns;
    unsigned char buffer[READ_BUFFER];
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double own_cpu_s(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

static double process_cpu_s(int pid) {
    char path[64], text[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *file = fopen(path, "r");
    if (!file) return -1.0;
    size_t n = fread(text, 1, sizeof text - 1, file);
    fclose(file);
    text[n] = 0;
    char *p = strrchr(text, ')'); /* the command name may hold spaces */
    if (!p) return -1.0;
    unsigned long utime = 0, stime = 0;
    /* after ")": state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2) return -1.0;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU time used by every process on the machine (all CPUs, /proc/stat's first line minus idle and iowait). */
static double machine_busy_s(void) {
    unsigned long long v[10] = {0};
    FILE *file = fopen("/proc/stat", "r");
    if (!file) return -1.0;
    int n = fscanf(file, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                   &v[5], &v[6], &v[7], &v[8], &v[9]);
    fclose(file);
    if (n < 8) return -1.0;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK);
}

static int hex_value(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int compare_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void send_next(struct conn *c, uint32_t *correlation) {
    unsigned char *frame = c->frames[c->next];
    int length = c->lengths[c->next];
    c->next = (c->next + 1) % c->nframes;
    uint32_t id = (++*correlation) & 0x7fffffffu;
    frame[8] = id >> 24; frame[9] = id >> 16; frame[10] = id >> 8; frame[11] = id;
    c->sent_ns = now_ns();
    int sent = 0;
    while (sent < length) { /* one small frame into an empty socket buffer: a partial write is a rarity */
        ssize_t n = send(c->fd, frame + sent, length - sent, MSG_NOSIGNAL);
        if (n > 0) { sent += n; continue; }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        c->open = 0;
        return;
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: hbload PLAN WARMUP_S SECONDS PIDS\n");
        return 2;
    }
    double warmup_s = atof(argv[2]), seconds = atof(argv[3]);
    int pids[MAX_PIDS], npids = 0;
    if (strcmp(argv[4], "-") != 0) {
        char *list = strdup(argv[4]);
        for (char *t = strtok(list, ","); t && npids < MAX_PIDS; t = strtok(NULL, ",")) pids[npids++] = atoi(t);
    }
    FILE *plan = fopen(argv[1], "r");
    if (!plan) { perror("plan"); return 2; }
    int capacity = 64, nconns = 0;
    struct conn *conns = calloc(capacity, sizeof *conns);
    char *line = NULL;
    size_t line_capacity = 0;
    int port, count;
    while (fscanf(plan, "%d %d\n", &port, &count) == 2) {
        if (nconns == capacity) {
            capacity *= 2;
            conns = realloc(conns, capacity * sizeof *conns);
        }
        struct conn *c = &conns[nconns++];
        memset(c, 0, sizeof *c);
        c->port = port;
        c->nframes = count;
        c->frames = calloc(count, sizeof *c->frames);
        c->lengths = calloc(count, sizeof *c->lengths);
        for (int i = 0; i < count; i++) {
            ssize_t n = getline(&line, &line_capacity, plan);
            if (n <= 1) { fprintf(stderr, "plan: short frame list\n"); return 2; }
            int bytes = (int)(n - 1) / 2;
            c->frames[i] = malloc(bytes);
            c->lengths[i] = bytes;
            for (int b = 0; b < bytes; b++) c->frames[i][b] = hex_value(line[2 * b]) << 4 | hex_value(line[2 * b + 1]);
        }
    }
    fclose(plan);
    if (nconns == 0) { fprintf(stderr, "plan: no connections\n"); return 2; }

    int ports[MAX_PORTS], nports = 0;
    uint64_t port_answers[MAX_PORTS] = {0};
    int epoll = epoll_create1(0);
    for (int i = 0; i < nconns; i++) {
        struct conn *c = &conns[i];
        int p = 0;
        while (p < nports && ports[p] != c->port) p++;
        if (p == nports) {
            if (nports == MAX_PORTS) { fprintf(stderr, "more than %d ports\n", MAX_PORTS); return 2; }
            ports[nports++] = c->port;
        }
        c->port_index = p;
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(c->port)};
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(c->fd, (struct sockaddr *)&address, sizeof address) != 0) {
            fprintf(stderr, "connect to port %d: %s\n", c->port, strerror(errno));
            return 1;
        }
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct epoll_event event = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(epoll, EPOLL_CTL_ADD, c->fd, &event);
        c->open = 1;
    }
    uint64_t *latencies = malloc(sizeof(uint64_t) * MAX_LATENCIES);
    uint64_t answers = 0, errors = 0, kept = 0, closed = 0;
    uint32_t correlation = 0;
    for (int i = 0; i < nconns; i++) send_next(&conns[i], &correlation);

    uint64_t started = now_ns();
    uint64_t measure_from = started + (uint64_t)(warmup_s * 1e9);
    uint64_t measure_to = measure_from + (uint64_t)(seconds * 1e9);
    int measuring = 0;
    double machine_before = 0, machine_after = 0;
    double cpu_before = 0, pid_before[MAX_PIDS], pid_after[MAX_PIDS], cpu_after = 0;
    uint64_t window_start = 0, window_end = 0;
    struct epoll_event events[256];
    for (;;) {
        uint64_t now = now_ns();
        if (!measuring && now >= measure_from) {
            measuring = 1;
            window_start = now;
            cpu_before = own_cpu_s();
            machine_before = machine_busy_s();
            for (int p = 0; p < npids; p++) pid_before[p] = process_cpu_s(pids[p]);
        }
        if (measuring && now >= measure_to) {
            window_end = now;
            cpu_after = own_cpu_s();
            machine_after = machine_busy_s();
            for (int p = 0; p < npids; p++) pid_after[p] = process_cpu_s(pids[p]);
            break;
        }
        int ready = epoll_wait(epoll, events, 256, 5);
        for (int e = 0; e < ready; e++) {
            struct conn *c = events[e].data.ptr;
            ssize_t n = recv(c->fd, c->buffer + c->received, READ_BUFFER - c->received, 0);
            if (n <= 0) {
                if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                epoll_ctl(epoll, EPOLL_CTL_DEL, c->fd, NULL);
                c->open = 0;
                closed++;
                continue;
            }
            c->received += (int)n;
            if (c->received < 4) continue;
            uint32_t size = (uint32_t)c->buffer[0] << 24 | c->buffer[1] << 16 | c->buffer[2] << 8 | c->buffer[3];
            if (size + 4 > READ_BUFFER) { fprintf(stderr, "response of %u bytes\n", size); return 1; }
            if ((uint32_t)c->received < size + 4) continue;
            uint64_t done = now_ns();
            if (measuring) {
                answers++;
                port_answers[c->port_index]++;
                if (size == 12 && (c->buffer[13] | c->buffer[14])) errors++;
                if (kept < MAX_LATENCIES) latencies[kept++] = done - c->sent_ns;
            }
            c->received -= (int)(size + 4); /* one request in flight: nothing should follow it; keep it if so */
            if (c->received) memmove(c->buffer, c->buffer + size + 4, c->received);
            send_next(c, &correlation);
            if (!c->open) { /* the server closed it: no more requests on it */
                epoll_ctl(epoll, EPOLL_CTL_DEL, c->fd, NULL);
                closed++;
            }
        }
    }
    double elapsed = (window_end - window_start) / 1e9;
    qsort(latencies, kept, sizeof *latencies, compare_u64);
    printf("{\"answers\": %llu, \"errors\": %llu, \"closed\": %llu, \"elapsed_s\": %.4f, \"p50_ms\": %.3f, "
           "\"p99_ms\": %.3f, \"client_cpu_s\": %.3f, \"machine_busy_s\": %.3f, \"pid_cpu_s\": {",
           (unsigned long long)answers, (unsigned long long)errors, (unsigned long long)closed, elapsed,
           kept ? latencies[kept / 2] / 1e6 : -1.0, kept ? latencies[(uint64_t)(kept * 0.99)] / 1e6 : -1.0,
           cpu_after - cpu_before, machine_after - machine_before);
    for (int p = 0; p < npids; p++)
        printf("%s\"%d\": %.3f", p ? ", " : "", pids[p], pid_after[p] - pid_before[p]);
    printf("}, \"port_answers\": {");
    for (int p = 0; p < nports; p++)
        printf("%s\"%d\": %llu", p ? ", " : "", ports[p], (unsigned long long)port_answers[p]);
    printf("}}\n");
    fflush(stdout);
    for (int i = 0; i < nconns; i++) close(conns[i].fd);
    return 0;
}
