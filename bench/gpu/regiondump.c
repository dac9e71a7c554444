/*
 * regiondump.c: prints a shim region (shim/include/hamid_region.h) as JSON,
 * read-only. The H100 benchmark uses it instead of the daemon's cffi reader
 * so that it needs nothing but gcc on the GPU machine.
 */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hamid_region.h"

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror(argv[1]); return 1; }
    const struct hamid_region *r = mmap(NULL, sizeof *r, PROT_READ, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED || r->magic != HAMID_REGION_MAGIC) { fprintf(stderr, "not a region\n"); return 1; }
    printf("{\"devices\": [");
    for (int d = 0; d < HAMID_MAX_DEVICES; d++) {
        const struct hamid_device *v = &r->devices[d];
        printf("%s{\"used\": %llu, \"limit\": %llu, \"peak\": %llu, \"oom\": %llu, \"sm_limit\": %u, \"context_bytes\": %llu, "
               "\"gpu_time_ns\": %llu, \"throttle_ns\": %llu, \"launches\": %llu}",
               d ? ", " : "", (unsigned long long)v->used_bytes, (unsigned long long)v->limit_bytes,
               (unsigned long long)v->peak_used_bytes, (unsigned long long)v->oom_count, v->sm_limit,
               (unsigned long long)v->context_bytes, (unsigned long long)v->gpu_time_ns,
               (unsigned long long)v->throttle_ns, (unsigned long long)v->launches);
    }
    printf("], \"procs\": [");
    int first = 1;
    for (unsigned i = 0; i < r->proc_high_water && i < HAMID_MAX_PROCS; i++) {
        const struct hamid_proc *p = &r->procs[i];
        if (p->pid <= 0) continue;
        printf("%s{\"slot\": %u, \"pid\": %d, \"nvml_pid\": %d, \"used\": %llu, \"context\": %llu}",
               first ? "" : ", ", i, p->pid, r->abi_version >= 2 ? p->nvml_pid : 0, (unsigned long long)p->used[0],
               (unsigned long long)p->context[0]);
        first = 0;
    }
    printf("], \"reclaimed\": %llu}\n", (unsigned long long)r->reclaimed_procs);
    return 0;
}
