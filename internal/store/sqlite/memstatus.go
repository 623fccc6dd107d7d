package sqlite

/*
// go-sqlite3 links SQLite into the binary; its API is reachable from here.
extern int sqlite3_config(int, ...);
extern long long sqlite3_memory_used(void);

// SQLITE_CONFIG_MEMSTATUS is 9 in sqlite3.h.
static int memstatusOff(void) { return sqlite3_config(9, 0); }
*/
import "C"

// memStatusErr is SQLite's answer to turning its allocation statistics off
// at start (0: off).
//
// With the statistics on (SQLite's default), every allocation and free in
// SQLite takes one process-wide mutex to count bytes, and SQLite allocates
// several times per statement: the writer and the readers then queue on
// that mutex. Only this package's test reads them (memoryUsed), and no
// soft heap limit is set. In the store's batched benchmark (submit, claim and
// three receipts per operation) this took 13 % less CPU per operation, in
// every one of five interleaved pairs.
//
// sqlite3_config must run before SQLite initializes, that is before the
// first connection opens: package initialization runs before any. A
// binary that opened SQLite earlier keeps the statistics (SQLITE_MISUSE):
// only slower.
var memStatusErr = int(C.memstatusOff())

// memoryUsed is sqlite3_memory_used: 0 while the statistics are off.
func memoryUsed() int64 { return int64(C.sqlite3_memory_used()) }
