# Sourced by the scripts that run Python peers, from the project root: the virtual
# environment scripts/bootstrap made (when the python3 on PATH lacked the test peers'
# modules) comes first on PATH. PINGATE_VENV names another one.
venv=${PINGATE_VENV:-$PWD/.venv}
if [ -x "$venv/bin/python3" ]; then PATH="$venv/bin:$PATH"; export PATH; fi
