#!/bin/sh
# The image's entry point. Before `bastion serve` or `bastion run` it runs `bastion sandbox doctor`: a container
# whose runtime forbids what bubblewrap needs (user namespaces, mount, an unmasked /proc) would otherwise start,
# refuse every local server and sit unready; stopping here puts the doctor's reason in the container's log and
# its restart count. Any other command (`sandbox doctor`, `check`, `audit verify` ...) is bastion's, as given.
set -eu
case "${1:-}" in
    serve|run)
        if ! report=$(bastion sandbox doctor 2>&1); then
            printf '%s\n' "$report" >&2
            echo "bastion-entrypoint: servers cannot be sandboxed in this container, so Bastion does not start;" \
                 "see docs/deploy.md, \"The container image\", for what the runtime must allow" >&2
            exit 1
        fi
        ;;
esac
exec bastion "$@"
