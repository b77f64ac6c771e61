"""The sandbox a learner's code runs in: `Sandbox` (a worker process behind bubblewrap, or Landlock
and seccomp where bubblewrap cannot start), its `limits`, the `isolation` it chooses, `cgroup`,
`seccomp` (built by libseccomp, else by `seccomp_assembler`) and `landlock` walls, a `pool` of
warm sandboxes, and the `worker` inside.

Light on purpose: nothing is imported here (the worker loads its siblings by path)."""
