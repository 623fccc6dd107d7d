#!/usr/bin/env bash
# Start or stop the project's Mosquitto on a loopback port.
#   mosquitto/broker.sh start PORT DIR   renders DIR/mosquitto.conf, starts the broker, waits for the port
#   mosquitto/broker.sh stop DIR         stops the broker started with DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${MOSQUITTO:-/usr/sbin/mosquitto}

case "${1:-}" in
start)
	port=${2:?port}; dir=${3:?dir}
	[ -x "$bin" ] || { echo "mosquitto not found at $bin: run 'make deps' (apt-get install mosquitto)" >&2; exit 1; }
	mkdir -p "$dir/data"
	dir=$(cd "$dir" && pwd)
	sed -e "s|@PORT@|$port|" -e "s|@DATA@|$dir/data|" -e "s|@AUTOSAVE@|1|" -e "s|@USER@|$(id -un)|" \
		"$here/mosquitto.conf.tmpl" >"$dir/mosquitto.conf"
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
	echo "usage: $0 start PORT DIR | stop DIR" >&2; exit 2
	;;
esac
