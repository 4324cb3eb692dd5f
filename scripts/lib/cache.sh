# Caches that every clone on this machine shares, outside the clone (a fresh clone's CI run
# reuses what an earlier run installed): the test assets and the Python environments. Each
# environment's folder is keyed by what determines its contents (its requirements file or
# setup script, and the Python version), so a change to those makes a new one.
#
#   source scripts/lib/cache.sh
#   dir="$(cache_dir venv-server scripts/requirements/server.txt)"

STRATA_CACHE="${STRATA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/strata}"
export STRATA_CACHE

# cache_dir NAME FILE...: $STRATA_CACHE/NAME-<hash of the files and python3's version>.
cache_dir() {
    local name=$1 key
    shift
    key="$({ cat "$@"; python3 --version; } | sha256sum | cut -c1-16)"
    echo "$STRATA_CACHE/$name-$key"
}
