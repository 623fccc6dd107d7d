// Package benchwire is the wire protocol without a controller behind it:
// the two ends that `make bench` puts on a broker to measure the protocol's
// own ceiling, with no database and no controller logic in the way.
//
//   - MemoryFleet is a throwaway fleet: one MQTT connection per device
//     (client id = device id), a retained birth with capabilities
//     dedupe:true, query:true and a retained LWT of the same session, and
//     for each command the three receipts a simulated device sends
//     (received, executing, succeeded; seq 1, 2, 3; QoS 1 on
//     {root}/{d}/receipts), encoded with internal/wire exactly as
//     internal/sim does. It keeps what it saw in memory only: a repeated
//     command_id, or another command of an operation that already ran, is
//     answered with the latest receipt of the one that ran; a query with
//     that receipt or "unknown". It never touches a disk, so it is the
//     fastest conforming device there is, and its receipts are what the
//     controller ingests in the bench's controller phase as well.
//   - Commander is a plain MQTT client in the controller's seat: it
//     publishes a Command (QoS 1) and returns the device's final receipt,
//     matched by command_id on its {root}/+/receipts subscription (QoS 1).
//
// Session numbers of a MemoryFleet come from the wall clock in
// microseconds, raised by one for every connection of the process, so a
// birth is newer than any earlier one of the same device id without any
// state on disk (a controller orders presence by session).
package benchwire
