/* One classic rebalance of a Stable group, for bench.coordinator --rebalance-client c: every member's JoinGroup
   written at once, every answer read, then every member's SyncGroup (the generation the answers carry patched in),
   every answer read. The connections are the load generator's own (inherited descriptors, their reading paused in
   the parent meanwhile), so the group and its member ids are the ones bench.coordinator formed.

   rbload PLAN

   PLAN is a text file: a first line "COUNT GENERATION_OFFSET", then COUNT lines "FD JOIN_HEX SYNC_HEX": a member's
   connection and its two request frames (size prefix included, correlation ids set), in the order to send them;
   GENERATION_OFFSET is where the SyncGroup frames hold the generation (int32, big-endian), written from the
   JoinGroup answers. Answers are checked by their error code (int16 after the size, the correlation id, the
   flexible header's empty tags and the throttle time: byte 13, for JoinGroup v6+ and SyncGroup v4+). Prints one line
   of JSON: rebalance_ms (first JoinGroup written -> last SyncGroup answer read), sync_phase_ms (first SyncGroup
   written -> last answer read), cpu_ms (its own), the errors counted, the generation, and the marks of its steps
   (CLOCK_MONOTONIC and its own CPU, in seconds, named as bench.coordinator's RoundStamps names them; it has no
   decoding step: an answer's end is where its step ends).

   Why C: the Python load generator costs 50-65 ms of CPU per 1,000-member rebalance on its core, about what the
   servers under test cost on theirs, so it sets the rebalance's pace for both; this one costs mostly the kernel's
   send and receive. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

struct member {
    int fd;
    unsigned char *join;
    size_t join_len;
    unsigned char *sync;
    size_t sync_len;
    unsigned char *answer; /* the answer being read */
    size_t have, want, cap;
    int done;
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double own_cpu_ms(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
           (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3;
}

static unsigned char *from_hex(const char *hex, size_t *length) {
    size_t n = strlen(hex) / 2;
    unsigned char *out = malloc(n);
    for (size_t i = 0; i < n; i++) {
        unsigned int byte;
        sscanf(hex + 2 * i, "%2x", &byte);
        out[i] = (unsigned char)byte;
    }
    *length = n;
    return out;
}

static void write_all(int fd, const unsigned char *data, size_t length) {
    while (length > 0) {
        ssize_t n = write(fd, data, length);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) continue; /* a full socket buffer: the peer reads soon */
            perror("write");
            exit(2);
        }
        data += n;
        length -= (size_t)n;
    }
}

/* Reads what `m`'s connection has; 1 once its answer is whole. */
static int read_some(struct member *m) {
    for (;;) {
        if (m->want == 0 && m->have >= 4) {
            m->want = 4 + (((size_t)m->answer[0] << 24) | ((size_t)m->answer[1] << 16) |
                           ((size_t)m->answer[2] << 8) | m->answer[3]);
            if (m->want > m->cap) {
                m->answer = realloc(m->answer, m->want);
                m->cap = m->want;
            }
        }
        if (m->want != 0 && m->have >= m->want) return 1;
        size_t room = m->want ? m->want - m->have : 4 - m->have;
        ssize_t n = read(m->fd, m->answer + m->have, room);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return 0;
            perror("read");
            exit(2);
        }
        if (n == 0) {
            fprintf(stderr, "rbload: connection %d closed\n", m->fd);
            exit(2);
        }
        m->have += (size_t)n;
    }
}

/* Every member's answer read; returns how many carried an error (the int16 at byte 13). */
static int read_answers(int epoll_fd, struct member *members, int count, int32_t *generation) {
    struct epoll_event events[256];
    int left = count, errors = 0;
    for (int i = 0; i < count; i++) {
        members[i].have = members[i].want = 0;
        members[i].done = 0;
    }
    while (left > 0) {
        int ready = epoll_wait(epoll_fd, events, 256, 60000);
        if (ready <= 0) {
            if (ready < 0 && errno == EINTR) continue;
            fprintf(stderr, "rbload: %d answers missing after 60 s\n", left);
            exit(2);
        }
        for (int e = 0; e < ready; e++) {
            struct member *m = &members[events[e].data.u32];
            if (m->done || !read_some(m)) continue;
            m->done = 1;
            left--;
            /* size 0-3, correlation id 4-7, the header's tags 8, throttle 9-12, error 13-14, generation 15-18 */
            if (m->have < 15 || (m->answer[13] | m->answer[14])) errors++;
            if (generation != NULL && m->have >= 19)
                *generation = (int32_t)(((uint32_t)m->answer[15] << 24) | ((uint32_t)m->answer[16] << 16) |
                                        ((uint32_t)m->answer[17] << 8) | m->answer[18]);
        }
    }
    return errors;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: rbload PLAN\n");
        return 2;
    }
    FILE *plan = fopen(argv[1], "r");
    if (plan == NULL) {
        perror(argv[1]);
        return 2;
    }
    int count;
    long generation_offset;
    if (fscanf(plan, "%d %ld", &count, &generation_offset) != 2) return 2;
    struct member *members = calloc((size_t)count, sizeof *members);
    static char join_hex[1 << 20], sync_hex[1 << 22];
    int epoll_fd = epoll_create1(0);
    for (int i = 0; i < count; i++) {
        struct member *m = &members[i];
        if (fscanf(plan, "%d %1048575s %4194303s", &m->fd, join_hex, sync_hex) != 3) return 2;
        m->join = from_hex(join_hex, &m->join_len);
        m->sync = from_hex(sync_hex, &m->sync_len);
        m->cap = 4096;
        m->answer = malloc(m->cap);
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, m->fd, &event) < 0) {
            perror("epoll_ctl");
            return 2;
        }
    }
    fclose(plan);
    double cpu_before = own_cpu_ms();
    double started = now_ms();
    double marks[5][2]; /* (CLOCK_MONOTONIC ms, own CPU ms): for bench.rebalance_trace's timeline */
    for (int i = 0; i < count; i++) write_all(members[i].fd, members[i].join, members[i].join_len);
    marks[0][0] = now_ms(), marks[0][1] = own_cpu_ms();
    int32_t generation = -1;
    int join_errors = read_answers(epoll_fd, members, count, &generation);
    double sync_started = now_ms();
    marks[1][0] = sync_started, marks[1][1] = own_cpu_ms();
    for (int i = 0; i < count; i++) {
        struct member *m = &members[i];
        m->sync[generation_offset] = (unsigned char)(generation >> 24);
        m->sync[generation_offset + 1] = (unsigned char)(generation >> 16);
        m->sync[generation_offset + 2] = (unsigned char)(generation >> 8);
        m->sync[generation_offset + 3] = (unsigned char)generation;
        write_all(m->fd, m->sync, m->sync_len);
    }
    marks[2][0] = now_ms(), marks[2][1] = own_cpu_ms();
    int sync_errors = read_answers(epoll_fd, members, count, NULL);
    double ended = now_ms();
    double cpu_after = own_cpu_ms();
    printf("{\"rebalance_ms\": %.3f, \"sync_phase_ms\": %.3f, \"cpu_ms\": %.3f, \"join_errors\": %d, "
           "\"sync_errors\": %d, \"generation\": %d, \"marks\": {\"joins_sending\": [%.6f, %.6f], "
           "\"joins_sent\": [%.6f, %.6f], \"join_answer_last\": [%.6f, %.6f], \"syncs_sending\": [%.6f, %.6f], "
           "\"syncs_sent\": [%.6f, %.6f], \"sync_answer_last\": [%.6f, %.6f], "
           "\"sync_answers_decoded\": [%.6f, %.6f]}}\n",
           ended - started, ended - sync_started, cpu_after - cpu_before, join_errors, sync_errors, generation,
           started / 1e3, cpu_before / 1e3, marks[0][0] / 1e3, marks[0][1] / 1e3, marks[1][0] / 1e3,
           marks[1][1] / 1e3, marks[1][0] / 1e3, marks[1][1] / 1e3, marks[2][0] / 1e3, marks[2][1] / 1e3,
           ended / 1e3, cpu_after / 1e3, ended / 1e3, cpu_after / 1e3);
    return 0;
}
