"""Runs commands as the processes of one container: started by
`unshare --pid --fork`, this script is pid 1 of a new pid namespace, so its
children see container pids while NVML (which ignores namespaces) reports
them by host pid, as in a real container. Each child's first stdout line
("ready ...") is relayed; one line read on stdin is passed to every child.

    unshare --pid --fork python3 pidns.py '[["cmd", "arg"], ["cmd2"]]'
"""

import json
import subprocess
import sys


def main() -> int:
    cmds = json.loads(sys.argv[1])
    ps = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for c in cmds]
    for p in ps:
        print(p.stdout.readline().rstrip(), flush=True)
    line = sys.stdin.readline() or "x\n"
    for p in ps:
        p.stdin.write(line)
        p.stdin.flush()
    return max(p.wait() for p in ps)


if __name__ == "__main__":
    sys.exit(main())
