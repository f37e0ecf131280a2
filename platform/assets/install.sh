#!/bin/sh
# gpum bootstrap script, served by gpum-platform at /install.sh.
#
# It downloads gpum-install from the platform named below into a fresh directory under
# $TMPDIR (or /tmp), checks its SHA-256 against the checksum the platform publishes, and runs
# it with the arguments given to this script. It changes nothing else on the machine.
#
# Exit codes: 20 when the download or the checksum check fails (nothing is run then); 10 when
# the downloaded installer cannot be started (usually TMPDIR mounted noexec); otherwise the
# installer's own code.
#
# To check this script by hand first: download it with curl -fsSL -o install.sh URL/install.sh,
# read it, then run: sudo sh install.sh --dry-run
# The dashboard's command puts the join code on a line of its own ahead of this script,
#   { echo gpum_code=GPUM-...; curl -fsSL URL/install.sh; } | sudo bash -s --
# so that the code appears in no process's command line (echo is a shell builtin).
# The whole body is one function called on the last line, so a shell reading it from a pipe
# runs nothing until it has read everything.

gpum_main() {
    GPUM_PLATFORM_URL='@GPUM_PLATFORM_URL@'

    gpum_lang=en
    for gpum_v in "${LC_ALL:-}" "${LC_MESSAGES:-}" "${LANG:-}"; do
        if [ -n "$gpum_v" ]; then
            case "$gpum_v" in
                ru*) gpum_lang=ru ;;
            esac
            break
        fi
    done

    gpum_tmp=""
    trap 'gpum_cleanup' EXIT
    trap 'exit 130' INT TERM

    case "$GPUM_PLATFORM_URL" in
        https://*) gpum_proto=https ;;
        *) gpum_proto=http ;;
    esac

    gpum_tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpum-install.XXXXXX") || gpum_fail_download "cannot create a directory in ${TMPDIR:-/tmp}"
    gpum_fetch "$GPUM_PLATFORM_URL/dl/gpum-install.sha256" "$gpum_tmp/gpum-install.sha256" \
        || gpum_fail_download "cannot download $GPUM_PLATFORM_URL/dl/gpum-install.sha256"
    gpum_fetch "$GPUM_PLATFORM_URL/dl/gpum-install" "$gpum_tmp/gpum-install" \
        || gpum_fail_download "cannot download $GPUM_PLATFORM_URL/dl/gpum-install"

    gpum_expected=$(head -n 1 "$gpum_tmp/gpum-install.sha256" | cut -d ' ' -f 1 | tr 'A-F' 'a-f')
    case "$gpum_expected" in
        *[!0-9a-f]* | "") gpum_fail_download "gpum-install.sha256 holds no SHA-256" ;;
    esac
    [ "${#gpum_expected}" -eq 64 ] || gpum_fail_download "gpum-install.sha256 holds no SHA-256"
    gpum_actual=$(gpum_sha256 "$gpum_tmp/gpum-install") || gpum_fail_download "neither sha256sum nor shasum is installed"
    # Fail closed: no tool, an empty result or any difference stops here.
    [ "$gpum_actual" = "$gpum_expected" ] || gpum_fail_download "checksum mismatch"

    chmod 0700 "$gpum_tmp/gpum-install" || gpum_fail_download "cannot make the installer executable"
    # The platform URL is no secret: it goes on the command line, where the installer reads --server.
    # The join code is: the dashboard's command sets it as the shell variable gpum_code on the
    # line before this script (never in any command line), and it reaches the installer on its
    # standard input, through printf, a shell builtin. The installer then binds it to this
    # machine before it changes anything (docs/trust.md).
    if [ -n "${gpum_code:-}" ]; then
        printf '%s\n' "$gpum_code" | "$gpum_tmp/gpum-install" --server "$GPUM_PLATFORM_URL" "$@"
    else
        "$gpum_tmp/gpum-install" --server "$GPUM_PLATFORM_URL" "$@"
    fi
    gpum_rc=$?
    if [ "$gpum_rc" -eq 126 ]; then
        gpum_fail_exec
    fi
    exit "$gpum_rc"
}

# shellcheck disable=SC2317 # called by the EXIT trap
gpum_cleanup() {
    if [ -n "${gpum_tmp:-}" ]; then
        rm -rf "$gpum_tmp"
    fi
}

gpum_fetch() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsS --proto "=$gpum_proto" --retry 2 --connect-timeout 20 --max-time 900 -o "$2" "$1"
    elif command -v wget >/dev/null 2>&1; then
        # No redirect is followed, as curl (without -L) follows none: a redirect could lead
        # from https to http.
        wget -q -T 20 -t 3 --max-redirect=0 -O "$2" "$1"
    else
        return 1
    fi
}

gpum_sha256() {
    if command -v sha256sum >/dev/null 2>&1; then
        gpum_out=$(sha256sum "$1") || return 1
    elif command -v shasum >/dev/null 2>&1; then
        gpum_out=$(shasum -a 256 "$1") || return 1
    else
        return 1
    fi
    printf '%s\n' "${gpum_out%% *}"
}

# gpum_die CODE RUSSIAN ENGLISH: the message in the user's language on stderr, then exit CODE.
gpum_die() {
    if [ "$gpum_lang" = ru ]; then
        printf '%s\n' "$2" >&2
    else
        printf '%s\n' "$3" >&2
    fi
    exit "$1"
}

gpum_fail_download() {
    gpum_die 20 \
        "Не удалось скачать или проверить агент: $1. Повторите попытку; если ошибка повторяется, напишите нам." \
        "Could not download or verify the agent: $1. Try again; if it keeps failing, contact us."
}

gpum_fail_exec() {
    gpum_die 10 \
        "Не удалось запустить скачанный агент. Скорее всего, ${TMPDIR:-/tmp} смонтирован с запретом запуска (noexec): замените в команде установки sudo bash на sudo env TMPDIR=/var/tmp bash." \
        "Could not run the downloaded agent. Most likely ${TMPDIR:-/tmp} is mounted noexec: in the install command, replace sudo bash with sudo env TMPDIR=/var/tmp bash."
}

gpum_main "$@"
