#!/usr/bin/env bash
# services.sh — make sure Postgres and Redis answer for Sluice's dev and test runs.
#
#   bash scripts/services.sh          bring them up (the default), print the URLs, write .data/env
#   bash scripts/services.sh stop     stop the private instances this script started under .data/
#   source scripts/services.sh        "up", and export the URLs into the calling shell
#
# Inputs (all optional):
#   DATABASE_URL  Postgres server URL (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)
#   REDIS_URL     Redis URL (default redis://127.0.0.1:6379/0; redis+cluster:// and host:port,host:port too)
#   CI=true       a service that cannot be brought up is a failure (exit 1) instead of a warning
#   SERVICES_DATA_DIR  where private instances and the env file live (default <repo>/.data)
#
# What "up" does for each service, in order:
#   1. already answering at the URL: use it (the fast path);
#   2. URL on another host: nothing to start here, so report it;
#   3. binaries missing: apt-get install them as root, else print what to install and exit 1;
#   4. Postgres only: a Debian cluster (pg_lsclusters) on that port: pg_ctlcluster ... start;
#   5. a private instance under $SERVICES_DATA_DIR on that port, or on a free port when that
#      port is taken, with the URL changed to match.
# Then it creates the database "sluice" (used by `make run`) when psql is at hand, and writes
# $SERVICES_DATA_DIR/env with DATABASE_URL (the server; tests create their own databases there),
# APP_DATABASE_URL (the same server, database sluice) and REDIS_URL.

svc_default_database_url='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
svc_default_redis_url='redis://127.0.0.1:6379/0'
svc_app_database='sluice'

svc_say() { printf 'services: %s\n' "$*" >&2; }

# svc_problem reports a service that is not usable: fatal under CI=true, a warning otherwise
# (tests then skip instead of fail, and `make run` reports the connection error itself).
svc_problem() {
	if [[ ${CI:-} == true ]]; then
		svc_say "ERROR: $*"
		return 1
	fi
	svc_say "WARNING: $* (continuing; set CI=true to make this fatal)"
	return 0
}

# --- URLs ----------------------------------------------------------------------------------

# svc_hostport URL DEFAULT_PORT prints "host port" for the first server of URL.
svc_hostport() {
	local rest=${1#*://} host port
	rest=${rest%%[/?]*}  # authority only
	rest=${rest##*@}     # drop user:password@
	rest=${rest%%,*}     # first seed of a cluster list
	if [[ $rest == \[* ]]; then # [::1]:6379
		host=${rest%%]*}
		host=${host#[}
		port=${rest##*]}
		port=${port#:}
	else
		host=${rest%%:*}
		port=''
		[[ $rest == *:* ]] && port=${rest##*:}
	fi
	printf '%s %s\n' "${host:-127.0.0.1}" "${port:-$2}"
}

svc_is_local() {
	case $1 in
	127.0.0.1 | localhost | ::1 | 0.0.0.0) return 0 ;;
	*) return 1 ;;
	esac
}

# svc_url_with_path URL PATH replaces the path of URL (keeping scheme, authority and query).
svc_url_with_path() {
	local url=$1 query='' rest authority
	[[ $url == *\?* ]] && query="?${url#*\?}"
	rest=${url%%\?*}
	rest=${rest#*://}
	authority=${rest%%/*}
	printf '%s://%s/%s%s\n' "${url%%://*}" "$authority" "$2" "$query"
}

# svc_url_path URL prints the path of URL without the leading slash ("" when none).
svc_url_path() {
	local rest=${1%%\?*}
	rest=${rest#*://}
	[[ $rest == */* ]] && printf '%s\n' "${rest#*/}" || printf '\n'
}

# svc_redact hides a password in a URL for printing.
svc_redact() {
	sed -E 's#(://[^:/@]*:)[^@/]*@#\1***@#' <<<"$1"
}

# --- probes (no client tools needed) -------------------------------------------------------

# svc_port_open HOST PORT: something accepts TCP connections there.
svc_port_open() {
	# shellcheck disable=SC2016 # $0 and $1 expand in the inner bash
	timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
}

# svc_postgres_up URL: a Postgres server answers (pg_isready when present, else the
# protocol's SSLRequest, which any Postgres answers with a single "S" or "N").
svc_postgres_up() {
	if command -v pg_isready >/dev/null 2>&1; then
		PGCONNECT_TIMEOUT=3 pg_isready -q -d "$1" 2>/dev/null
		return
	fi
	local host port
	read -r host port < <(svc_hostport "$1" 5432)
	# shellcheck disable=SC2016 # $0 and $1 expand in the inner bash
	timeout 3 bash -c '
		exec 3<>"/dev/tcp/$0/$1" || exit 1
		printf "\x00\x00\x00\x08\x04\xd2\x16\x2f" >&3
		IFS= read -r -n 1 reply <&3
		[[ $reply == S || $reply == N ]]' "$host" "$port" 2>/dev/null
}

# svc_redis_up URL: a Redis server answers PING (+PONG, or an error such as NOAUTH,
# which still proves a Redis is there).
svc_redis_up() {
	local host port
	read -r host port < <(svc_hostport "$1" 6379)
	# shellcheck disable=SC2016 # $0 and $1 expand in the inner bash
	timeout 3 bash -c '
		exec 3<>"/dev/tcp/$0/$1" || exit 1
		printf "PING\r\n" >&3
		IFS= read -r reply <&3
		[[ $reply == +PONG* || $reply == -* ]]' "$host" "$port" 2>/dev/null
}

# svc_wait PROBE URL: poll for up to 30 s.
svc_wait() {
	local i
	for ((i = 0; i < 60; i++)); do
		"$1" "$2" && return 0
		sleep 0.5
	done
	return 1
}

# svc_free_port START: the first port from START on that nobody listens on.
svc_free_port() {
	local p=$1
	while svc_port_open 127.0.0.1 "$p"; do ((p++)); done
	printf '%s\n' "$p"
}

# --- installing ----------------------------------------------------------------------------

svc_apt_updated=''

# svc_install WHAT PACKAGE...: apt-get install as root; otherwise say what to install and fail.
svc_install() {
	local what=$1
	shift
	if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
		svc_say "ERROR: $what is not installed. Install it, then run this again:"
		svc_say "    sudo apt-get update && sudo apt-get install -y $*"
		svc_say "(or point DATABASE_URL / REDIS_URL at running servers)"
		return 1
	fi
	svc_say "installing $* (apt-get)"
	if [[ -z $svc_apt_updated ]]; then
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || return 1
		svc_apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# --- Postgres ------------------------------------------------------------------------------

# svc_pg_bindir prints the directory holding initdb and pg_ctl (Debian keeps them off PATH).
svc_pg_bindir() {
	local d
	d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
	if [[ -n $d && -x $d/initdb ]]; then
		printf '%s\n' "$d"
	elif command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(command -v pg_ctl)"
	else
		return 1
	fi
}

# svc_as_postgres CMD...: Postgres refuses to run as root, so root runs it as user postgres.
svc_as_postgres() {
	if [[ $EUID -eq 0 ]]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# svc_debian_cluster PORT prints "version name status" of the Debian cluster on PORT, if any.
svc_debian_cluster() {
	command -v pg_lsclusters >/dev/null 2>&1 || return 1
	pg_lsclusters -h 2>/dev/null | awk -v port="$1" '$3 == port { print $1, $2, $4; found = 1; exit } END { exit !found }'
}

# svc_private_postgres URL: start (creating it first if needed) the private instance under
# $SERVICES_DATA_DIR/postgres; prints the URL it listens on.
svc_private_postgres() {
	local url=$1 bindir dir port want_port host
	bindir=$(svc_pg_bindir) || return 1
	dir=$svc_data_dir/postgres
	read -r host want_port < <(svc_hostport "$url" 5432)

	if [[ $EUID -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
		svc_say "creating system user postgres"
		useradd --system --user-group --no-create-home --shell /usr/sbin/nologin postgres || return 1
	fi
	mkdir -p "$dir" || return 1
	if [[ $EUID -eq 0 ]]; then
		chown postgres: "$dir" && chmod 700 "$dir" || return 1
	fi
	if ! svc_as_postgres test -w "$dir"; then
		svc_say "ERROR: user postgres cannot write $dir (a parent folder is closed to it);"
		svc_say "    set SERVICES_DATA_DIR to a folder it can reach, e.g. /var/tmp/sluice"
		return 1
	fi

	if [[ ! -f $dir/PG_VERSION ]]; then
		port=$want_port
		svc_port_open 127.0.0.1 "$port" && port=$(svc_free_port 15432)
		svc_say "creating a private Postgres in $dir (port $port)"
		svc_as_postgres "$bindir/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --no-locale >"$svc_data_dir/postgres-initdb.log" 2>&1 || {
			svc_say "ERROR: initdb failed; see $svc_data_dir/postgres-initdb.log"
			return 1
		}
		# A throwaway dev/test server: TCP on loopback only, no Unix socket (its
		# path could be too long here), and durability traded for speed.
		svc_as_postgres tee -a "$dir/postgresql.conf" >/dev/null <<-EOF

			# added by scripts/services.sh
			listen_addresses = '127.0.0.1'
			port = $port
			unix_socket_directories = ''
			fsync = off
			synchronous_commit = off
			full_page_writes = off
			max_connections = 200
		EOF
	fi

	port=$(awk -F'[= ]+' '$1 == "port" { p = $2 } END { print p }' "$dir/postgresql.conf")
	if ! svc_as_postgres "$bindir/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
		if svc_port_open 127.0.0.1 "$port"; then
			port=$(svc_free_port 15432)
			svc_say "port taken; moving the private Postgres to port $port"
			printf 'port = %s\n' "$port" | svc_as_postgres tee -a "$dir/postgresql.conf" >/dev/null
		fi
		svc_say "starting the private Postgres in $dir (port $port)"
		svc_as_postgres "$bindir/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 start >/dev/null || {
			svc_say "ERROR: Postgres did not start; see $dir/server.log"
			return 1
		}
	fi
	local db query=''
	db=$(svc_url_path "$url")
	[[ -n $db ]] || db=postgres
	[[ $url == *\?* ]] && query="?${url#*\?}"
	printf 'postgres://postgres@127.0.0.1:%s/%s%s\n' "$port" "$db" "$query"
}

# svc_postgres: settle DATABASE_URL.
svc_postgres() {
	local url=${DATABASE_URL:-$svc_default_database_url} host port cluster ver name status
	case $url in
	postgres://* | postgresql://*) ;;
	*)
		svc_problem "DATABASE_URL must be a postgres:// URL"
		return
		;;
	esac
	if svc_postgres_up "$url"; then
		svc_say "postgres: $(svc_redact "$url") (already running)"
		DATABASE_URL=$url
		# The fault tests start a private server (testenv.StartPostgres).
		if ! svc_pg_bindir >/dev/null; then
			svc_install "PostgreSQL server binaries (initdb, pg_ctl)" postgresql ||
				svc_problem "no initdb/pg_ctl: TestPostgresRestartUnderConsole needs them"
		fi
		return
	fi
	read -r host port < <(svc_hostport "$url" 5432)
	if ! svc_is_local "$host"; then
		DATABASE_URL=$url
		svc_problem "postgres at $(svc_redact "$url") does not answer"
		return
	fi

	if ! svc_pg_bindir >/dev/null; then # no server binaries (psql alone is not enough)
		svc_install "PostgreSQL" postgresql || return 1
		# Debian's package creates (and may already start) cluster "main".
		if svc_postgres_up "$url"; then
			DATABASE_URL=$url
			svc_say "postgres: $(svc_redact "$url") (installed)"
			return 0
		fi
	fi

	if cluster=$(svc_debian_cluster "$port"); then
		read -r ver name status <<<"$cluster"
		svc_say "starting Debian cluster $ver/$name (was $status)"
		# Its exit status is not the verdict (it fails when the cluster is
		# already starting); whether the server then answers is.
		pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start >&2
		if svc_wait svc_postgres_up "$url"; then
			svc_say "postgres: $(svc_redact "$url") (started cluster $ver/$name)"
			DATABASE_URL=$url
			return 0
		fi
		svc_say "cluster $ver/$name did not come up; trying a private instance"
	fi

	local private
	if private=$(svc_private_postgres "$url") && svc_wait svc_postgres_up "$private"; then
		svc_say "postgres: $(svc_redact "$private") (private instance in $svc_data_dir/postgres)"
		DATABASE_URL=$private
		return 0
	fi
	DATABASE_URL=$url
	svc_problem "could not start Postgres for $(svc_redact "$url")"
}

# svc_app_database: create database "sluice" on the settled server unless it exists.
svc_app_database() {
	APP_DATABASE_URL=$(svc_url_with_path "$DATABASE_URL" "$svc_app_database")
	svc_postgres_up "$DATABASE_URL" || return 0
	if ! command -v psql >/dev/null 2>&1; then
		if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
			svc_install "psql" postgresql-client || true
		fi
		if ! command -v psql >/dev/null 2>&1; then
			svc_say "psql not found: sluice creates database \"$svc_app_database\" itself"
			return 0
		fi
	fi
	local exists
	exists=$(PGCONNECT_TIMEOUT=5 psql "$DATABASE_URL" -X -tAq -c "SELECT 1 FROM pg_database WHERE datname = '$svc_app_database'" 2>&1) || {
		svc_problem "cannot query $(svc_redact "$DATABASE_URL"): $exists"
		return
	}
	if [[ $exists != 1 ]]; then
		local out
		# A concurrent run may win the race; "already exists" is fine.
		if out=$(psql "$DATABASE_URL" -X -q -c "CREATE DATABASE $svc_app_database" 2>&1) || [[ $out == *"already exists"* ]]; then
			svc_say "created database \"$svc_app_database\""
		else
			svc_problem "create database $svc_app_database: $out"
			return
		fi
	fi
}

# --- Redis ---------------------------------------------------------------------------------

# svc_private_redis URL: start the private Redis under $SERVICES_DATA_DIR/redis (or find the
# one already running); prints its URL.
svc_private_redis() {
	local url=$1 dir=$svc_data_dir/redis host port pid db
	read -r host port < <(svc_hostport "$url" 6379)
	mkdir -p "$dir" || return 1
	db=$(svc_url_path "$url")
	[[ $db =~ ^[0-9]+$ ]] || db=0

	if [[ -f $dir/redis.pid && -f $dir/port ]]; then
		pid=$(<"$dir/redis.pid")
		if [[ -r /proc/$pid/comm && $(</proc/"$pid"/comm) == redis-server* ]]; then
			printf 'redis://127.0.0.1:%s/%s\n' "$(<"$dir/port")" "$db"
			return 0
		fi
	fi
	svc_port_open 127.0.0.1 "$port" && port=$(svc_free_port 16379)
	svc_say "starting a private Redis in $dir (port $port)"
	redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --dir "$dir" \
		--save "" --appendonly no --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >&2 || return 1
	printf '%s\n' "$port" >"$dir/port"
	printf 'redis://127.0.0.1:%s/%s\n' "$port" "$db"
}

# svc_redis: settle REDIS_URL.
svc_redis() {
	local url=${REDIS_URL:-$svc_default_redis_url} host port
	if svc_redis_up "$url"; then
		svc_say "redis: $(svc_redact "$url") (already running)"
		REDIS_URL=$url
		return 0
	fi
	read -r host port < <(svc_hostport "$url" 6379)
	REDIS_URL=$url
	if ! svc_is_local "$host" || [[ $url == redis+cluster://* || $url == *,* ]]; then
		svc_problem "redis at $(svc_redact "$url") does not answer"
		return
	fi
	if ! command -v redis-server >/dev/null 2>&1; then
		svc_install "Redis" redis-server || return 1
		# Debian's package may have started its own server on 6379.
		if svc_redis_up "$url"; then
			svc_say "redis: $(svc_redact "$url") (installed)"
			return 0
		fi
	fi
	local private
	if private=$(svc_private_redis "$url") && svc_wait svc_redis_up "$private"; then
		svc_say "redis: $private (private instance in $svc_data_dir/redis)"
		REDIS_URL=$private
		return 0
	fi
	svc_problem "could not start Redis for $(svc_redact "$url")"
}

# --- commands ------------------------------------------------------------------------------

svc_quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

svc_write_env() {
	local env=$svc_data_dir/env
	{
		echo "# Written by scripts/services.sh; sourced by make. Do not edit: it is rewritten on every run."
		echo "# DATABASE_URL: the Postgres server (tests create and drop their own databases there)."
		echo "export DATABASE_URL=$(svc_quote "$DATABASE_URL")"
		echo "# APP_DATABASE_URL: database \"$svc_app_database\" on that server, used by \`make run\`."
		echo "export APP_DATABASE_URL=$(svc_quote "$APP_DATABASE_URL")"
		echo "export REDIS_URL=$(svc_quote "$REDIS_URL")"
	} >"$env.tmp" && chmod 600 "$env.tmp" && mv "$env.tmp" "$env"
}

svc_up() {
	local failed=0
	mkdir -p "$svc_data_dir" || return 1
	svc_postgres || failed=1
	svc_redis || failed=1
	svc_app_database || failed=1
	export DATABASE_URL APP_DATABASE_URL REDIS_URL
	svc_write_env || return 1
	printf 'DATABASE_URL=%s\nAPP_DATABASE_URL=%s\nREDIS_URL=%s\n' \
		"$(svc_redact "$DATABASE_URL")" "$(svc_redact "$APP_DATABASE_URL")" "$(svc_redact "$REDIS_URL")"
	svc_say "wrote $svc_data_dir/env"
	return "$failed"
}

# svc_stop stops only the private instances under $SERVICES_DATA_DIR, by their pid files.
svc_stop() {
	local dir=$svc_data_dir bindir pid
	if [[ -f $dir/postgres/postmaster.pid ]] && bindir=$(svc_pg_bindir); then
		svc_say "stopping the private Postgres in $dir/postgres"
		svc_as_postgres "$bindir/pg_ctl" -D "$dir/postgres" -m fast -w stop >&2 || true
	fi
	if [[ -f $dir/redis/redis.pid ]]; then
		pid=$(<"$dir/redis/redis.pid")
		if [[ -r /proc/$pid/comm && $(</proc/"$pid"/comm) == redis-server* ]]; then
			svc_say "stopping the private Redis (pid $pid)"
			kill "$pid"
		fi
		rm -f "$dir/redis/redis.pid"
	fi
}

svc_main() {
	local root
	root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return 1
	svc_data_dir=${SERVICES_DATA_DIR:-$root/.data}
	case ${1:-up} in
	up) svc_up ;;
	stop) svc_stop ;;
	*)
		echo "usage: $0 [up|stop]" >&2
		return 2
		;;
	esac
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	set -uo pipefail
	svc_main "$@"
	exit
else
	# Sourced: always "up" (the caller's own arguments are not ours).
	svc_main up
fi
