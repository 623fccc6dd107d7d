#!/usr/bin/env bash
# Start or stop the project's Mosquitto on a loopback port.
#   mosquitto/broker.sh start PORT DIR   the anonymous loopback profile (anonymous-loopback.conf.tmpl):
#                                        renders DIR/mosquitto.conf, starts the broker, waits for the port
#   mosquitto/broker.sh start-secure PORT DIR CREDS_DIR TLS_DIR
#                                        the secure profile (secure.conf.tmpl): CREDS_DIR/passwd and
#                                        CREDS_DIR/acl from `devicesim creds --out CREDS_DIR`, TLS_DIR/ca.pem,
#                                        server.pem and server-key.pem; TLS on 127.0.0.1:PORT
#   mosquitto/broker.sh stop DIR         stops the broker started with DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${MOSQUITTO:-/usr/sbin/mosquitto}

case "${1:-}" in
start|start-secure)
	port=${2:?port}; dir=${3:?dir}
	[ -x "$bin" ] || { echo "mosquitto not found at $bin: run 'make deps' (apt-get install mosquitto)" >&2; exit 1; }
	mkdir -p "$dir/data"
	dir=$(cd "$dir" && pwd)
	if [ "$1" = start ]; then
		sed -e "s|@PORT@|$port|" -e "s|@DATA@|$dir/data|" -e "s|@AUTOSAVE@|1|" -e "s|@USER@|$(id -un)|" \
			"$here/anonymous-loopback.conf.tmpl" >"$dir/mosquitto.conf"
	else
		creds=$(cd "${4:?credentials directory}" && pwd); tls=$(cd "${5:?TLS directory}" && pwd)
		for f in "$creds/passwd" "$creds/acl" "$tls/ca.pem" "$tls/server.pem" "$tls/server-key.pem"; do
			[ -r "$f" ] || { echo "missing $f (devicesim creds --out $creds; the CA, certificate and key in $tls)" >&2; exit 1; }
		done
		sed -e "s|@PORT@|$port|" -e "s|@DATA@|$dir/data|" -e "s|@AUTOSAVE@|1|" -e "s|@USER@|$(id -un)|" \
			-e "s|@PASSWD@|$creds/passwd|" -e "s|@ACL@|$creds/acl|" \
			-e "s|@CAFILE@|$tls/ca.pem|" -e "s|@CERTFILE@|$tls/server.pem|" -e "s|@KEYFILE@|$tls/server-key.pem|" \
			"$here/secure.conf.tmpl" >"$dir/mosquitto.conf"
	fi
	"$bin" -c "$dir/mosquitto.conf" >"$dir/mosquitto.log" 2>&1 &
	echo $! >"$dir/mosquitto.pid"
	for _ in $(seq 1 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then exit 0; fi
		kill -0 "$(cat "$dir/mosquitto.pid")" 2>/dev/null || { cat "$dir/mosquitto.log" >&2; exit 1; }
		sleep 0.1
	done
	echo "mosquitto did not open port $port" >&2; exit 1
	;;
stop)
	dir=${2:?dir}
	[ -f "$dir/mosquitto.pid" ] || exit 0
	pid=$(cat "$dir/mosquitto.pid")
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$dir/mosquitto.pid"
	;;
*)
	echo "usage: $0 start PORT DIR | start-secure PORT DIR CREDS_DIR TLS_DIR | stop DIR" >&2; exit 2
	;;
esac
