# The `conda` shell function of a SWE-bench image's /opt/miniconda3, imitated in POSIX shell
# (no conda here): `conda activate [NAME|PREFIX]` puts an environment's bin/ first on PATH in
# place of the active one's and sets CONDA_PREFIX, CONDA_DEFAULT_ENV and CONDA_SHLVL as conda
# does; `conda deactivate` undoes it; anything else goes to the `conda` command. An environment
# is a directory holding conda-meta/ (base: /opt/miniconda3, NAME: envs/NAME). Safe under
# `set -u`, as eval scripts run it.
_CONDA_ROOT="${_CONDA_ROOT:-/opt/miniconda3}"
export CONDA_EXE="$_CONDA_ROOT/bin/conda"

__conda_without() {
    # PATH without the entry $1
    printf '%s' ":$PATH:" | sed "s|:$1:|:|g; s|^:||; s|:\$||"
}

__conda_deactivate() {
    if [ -n "${CONDA_PREFIX:-}" ]; then
        PATH=$(__conda_without "$CONDA_PREFIX/bin")
        export PATH
        unset CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_PROMPT_MODIFIER
        CONDA_SHLVL=$((${CONDA_SHLVL:-1} - 1))
        export CONDA_SHLVL
    fi
}

__conda_activate() {
    __conda_name="${1:-base}"
    case "$__conda_name" in
        base) __conda_prefix="$_CONDA_ROOT" ;;
        /*) __conda_prefix="$__conda_name" ;;
        *) __conda_prefix="$_CONDA_ROOT/envs/$__conda_name" ;;
    esac
    if [ ! -d "$__conda_prefix/conda-meta" ]; then
        echo "EnvironmentNameNotFound: Could not find conda environment: $__conda_name" >&2
        return 1
    fi
    __conda_deactivate
    PATH="$__conda_prefix/bin:$PATH"
    CONDA_PREFIX="$__conda_prefix"
    CONDA_DEFAULT_ENV="$__conda_name"
    CONDA_PROMPT_MODIFIER="($__conda_name) "
    CONDA_SHLVL=$((${CONDA_SHLVL:-0} + 1))
    export PATH CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_PROMPT_MODIFIER CONDA_SHLVL
}

conda() {
    case "${1:-}" in
        activate)
            shift
            __conda_activate "$@"
            ;;
        deactivate) __conda_deactivate ;;
        *) "$CONDA_EXE" "$@" ;;
    esac
}
