"""runtime: ``hamid-runtime``, the OCI runtime Docker calls (a runc wrapper).

On ``create`` it reads the bundle's ``config.json``; a container that asks
for nothing of ours goes to runc untouched. Otherwise it parses the request
with the shared request model, reserves through the local daemon (or the
ledger itself when no daemon runs), creates MIG instances if asked, edits
``config.json`` (devices, env, the shim's mounts, a poststop hook) and execs
runc. Any failure before the exec rolls back what was done. Every other verb
passes straight through.

:mod:`.argv` reads runc's command line, :mod:`.spec` edits ``config.json``,
:mod:`.devnodes` finds the GPU device nodes and MIG capability nodes,
:mod:`.rootfs` checks the container's root filesystem without following
symlinks out of it, :mod:`.node` talks to the daemon or the ledger,
:mod:`.main` is the entry point and :mod:`.liveness` tells the daemon's
reconciler whether a container still exists.
"""
