/*
 * limitsdump.c: the test suite's window on the shim's own limits reader
 * (shim/src/limits.c, compiled in with a test HAMID_LIMITS_PATH). It calls
 * limits_read() and prints what it returned and every field it read, one
 * "name value" per line, for the Python test to compare with what
 * hamid.shimlimits wrote. Used only by the test suite.
 */
#include <stdio.h>
#include <string.h>

#include "shim.h"
#include "hamid_limits.h"

/* limits.c's only outside needs besides libc */
int g_log_level;
void shim_log(int level, const char *fmt, ...) { (void)level; (void)fmt; }

int main(void)
{
    static struct hamid_limits l;
    char err[1024] = "";
    int r = limits_read(&l, err, sizeof err);
    printf("result %d\n", r);
    if (r < 0) printf("error %s\n", err);
    if (r <= 0) return 0;
    printf("device_count %u\nflags %u\npriority %d\nsm_mode %u\nsm_period_us %u\nregion_path %s\n", l.device_count,
           l.flags, l.priority, l.sm_mode, l.sm_period_us, l.region_path);
    for (unsigned i = 0; i < l.device_count; i++) {
        const struct hamid_limits_device *d = &l.devices[i];
        printf("device %u %s %llu %u", i, d->uuid, (unsigned long long)d->memory_bytes, d->sm_percent);
        for (unsigned s = 0; s < d->nslots; s++) printf(" %u-%u", d->slots[s][0], d->slots[s][1]);
        printf("\n");
    }
    return 0;
}
