"""The instructor's commands (`commands`: `mpcourse grade`, `release`, `collect`, `feedback`,
`report`), the class run (`class_run`), and what they read and write: `collect`, `feedback`,
`report`, `progress`.

Light on purpose: nothing is imported here, so that `mpcourse --help` loads no torch."""
