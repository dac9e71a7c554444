/*
 * limits.c: reading the daemon's limits file (layout in
 * include/hamid_limits.h) at the fixed path HAMID_LIMITS_PATH. It owns
 * deciding whether the file is there, whether it is one the shim may trust,
 * and copying its values into the configuration. It must not read the
 * environment (config.c decides what wins) and must not call the driver.
 *
 * Trust rules (fail closed): opened with O_NOFOLLOW (a symbolic link is
 * refused) and O_NONBLOCK (a FIFO cannot hang the process); a regular file,
 * owned by uid 0, writable by nobody but its owner, exactly
 * sizeof(struct hamid_limits) bytes, with the magic, an ABI this shim knows,
 * its own struct_size, and every value in range. Only ENOENT means "absent";
 * anything else that exists at the path but is not right is an error.
 */
#define _GNU_SOURCE
#include "shim.h"
#include "hamid_limits.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(HAMID_LIMITS_MAX_DEVICES == HAMID_MAX_DEVICES, "one device table size");
_Static_assert(HAMID_LIMITS_MAX_SLOTS == HAMID_MAX_SLOTS, "one slot table size");
_Static_assert(sizeof(((struct shim_config *)0)->region_path) >= HAMID_LIMITS_PATH_LEN, "region path fits");

HIDDEN const char *limits_path(void) { return HAMID_LIMITS_PATH; }

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

static int check(const struct hamid_limits *l, char *err, size_t errlen)
{
    const char *p = HAMID_LIMITS_PATH;
    if (l->magic != (uint64_t)HAMID_LIMITS_MAGIC)
        FAIL("%s: bad magic %#llx, expected %#llx (not a hamid limits file)", p, (unsigned long long)l->magic,
             (unsigned long long)HAMID_LIMITS_MAGIC);
    if (l->abi_version < HAMID_LIMITS_ABI_MIN || l->abi_version > HAMID_LIMITS_ABI_VERSION ||
        l->struct_size != sizeof *l)
        FAIL("%s: ABI %u of %u bytes; this shim (%s) reads ABI %d..%d of %zu bytes", p, l->abi_version,
             l->struct_size, HAMID_SHIM_VERSION, HAMID_LIMITS_ABI_MIN, HAMID_LIMITS_ABI_VERSION, sizeof *l);
    if (l->abi_version >= 2 && l->sm_policy > HAMID_LIMITS_POLICY_DISABLE)
        FAIL("%s: sm_policy %u, expected %d (default), %d (force) or %d (disable)", p, l->sm_policy,
             HAMID_LIMITS_POLICY_DEFAULT, HAMID_LIMITS_POLICY_FORCE, HAMID_LIMITS_POLICY_DISABLE);
    if (l->device_count > HAMID_LIMITS_MAX_DEVICES)
        FAIL("%s: device_count %u, at most %d", p, l->device_count, HAMID_LIMITS_MAX_DEVICES);
    if (l->flags & ~(uint32_t)(HAMID_LIMITS_FLAG_PRIORITY | HAMID_LIMITS_FLAG_MPS))
        FAIL("%s: unknown flags %#x", p, l->flags);
    if ((l->flags & HAMID_LIMITS_FLAG_MPS) && (l->device_count != 1 || l->devices[0].nslots))
        FAIL("%s: an MPS share has exactly one device and no time slots (device_count %u)", p, l->device_count);
    if (l->sm_mode != HAMID_LIMITS_SM_ENFORCE && l->sm_mode != HAMID_LIMITS_SM_OBSERVE)
        FAIL("%s: sm_mode %u, expected %d (enforce) or %d (observe)", p, l->sm_mode, HAMID_LIMITS_SM_ENFORCE,
             HAMID_LIMITS_SM_OBSERVE);
    if (l->sm_period_us < 1000 || l->sm_period_us > 10000000)
        FAIL("%s: sm_period_us %u, expected 1000..10000000", p, l->sm_period_us);
    if (!memchr(l->region_path, 0, sizeof l->region_path) || l->region_path[0] != '/')
        FAIL("%s: region_path is not an absolute, NUL-terminated path", p);
    for (uint32_t i = 0; i < l->device_count; i++) {
        const struct hamid_limits_device *d = &l->devices[i];
        if (!memchr(d->uuid, 0, sizeof d->uuid)) FAIL("%s: device %u: uuid is not NUL-terminated", p, i);
        if (d->sm_percent > 99) FAIL("%s: device %u: sm_percent %u, expected 0..99", p, i, d->sm_percent);
        if (d->nslots > HAMID_LIMITS_MAX_SLOTS) FAIL("%s: device %u: %u slots, at most %d", p, i, d->nslots, HAMID_LIMITS_MAX_SLOTS);
        if (d->nslots && !d->sm_percent) FAIL("%s: device %u: time slots without a compute limit", p, i);
        if (l->abi_version >= 3 && d->share_milli &&
            (d->share_milli < HAMID_LIMITS_SHARE_MIN || d->share_milli > HAMID_LIMITS_SHARE_MAX))
            FAIL("%s: device %u: share_milli %u, expected 0 (none) or %d..%d", p, i, d->share_milli,
                 HAMID_LIMITS_SHARE_MIN, HAMID_LIMITS_SHARE_MAX);
        if (l->abi_version >= 4 && d->others_active > 1)
            FAIL("%s: device %u: others_active %u, expected 0 or 1", p, i, d->others_active);
        unsigned prev = 0;
        for (uint32_t s = 0; s < d->nslots; s++) {
            unsigned a = d->slots[s][0], b = d->slots[s][1];
            if (a < prev || b <= a || b > 100)
                FAIL("%s: device %u: slot %u-%u: expected sorted, disjoint percent ranges within 0-100", p, i, a, b);
            prev = b;
        }
    }
    return 0;
}

/*
 * 0: no file (ENOENT). 1: read and valid, *out filled. -1: something is at
 * the path that the shim must not trust or cannot read; err says what.
 */
HIDDEN int limits_read(struct hamid_limits *out, char *err, size_t errlen)
{
    const char *p = HAMID_LIMITS_PATH;
    int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        if (errno == ELOOP) FAIL("%s is a symbolic link; only a regular file owned by root is accepted", p);
        FAIL("cannot open %s (%s)", p, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        FAIL("cannot stat %s (%s)", p, strerror(e));
    }
    const char *why = NULL;
    char buf[160];
    if (!S_ISREG(sb.st_mode)) why = "it is not a regular file";
    else if (sb.st_uid != 0) {
        snprintf(buf, sizeof buf, "it is owned by uid %u, not root", (unsigned)sb.st_uid);
        why = buf;
    } else if (sb.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(buf, sizeof buf, "its mode %04o lets group or others write it", (unsigned)(sb.st_mode & 07777));
        why = buf;
    } else if ((size_t)sb.st_size != sizeof *out) {
        snprintf(buf, sizeof buf, "it is %lld bytes, a limits file is %zu", (long long)sb.st_size, sizeof *out);
        why = buf;
    }
    if (why) {
        close(fd);
        FAIL("%s is refused: %s (expected a regular file of %zu bytes owned by root, mode 0644 or tighter)", p, why,
             sizeof *out);
    }
    size_t got = 0;
    while (got < sizeof *out) {
        ssize_t n = pread(fd, (char *)out + got, sizeof *out - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : 0;
            close(fd);
            FAIL("cannot read %s (%s)", p, e ? strerror(e) : "short read");
        }
        got += (size_t)n;
    }
    close(fd);
    return check(out, err, errlen) == 0 ? 1 : -1;
}
