"""Side effects live here. The CLI and bench enter through `service.Deployments` (check, up,
down, restart, status, logs); it drives the `executor` (with `processes`, `preflight`, `state`),
which reaches hosts only through the `transport.Transport` protocol: `local`, `ssh` (a
package), or the fake in `kvpd.testing`. `procfs` holds the /proc rules all of them share;
`fanout` is the one bounded pool they fan out on."""
