package sqlite

/*
int gatherRegister(const char *name);
long long gatherWalWrites(void);
long long gatherFileWrites(void);
void gatherFailWrites(int n);
*/
import "C"

// gatherVFS is the name of the writer's VFS (gather.c): SQLite's default,
// except that a WAL file's writes are gathered and reach the file in one
// write for up to 30 frames, at the latest at the commit's sync.
//
// SQLite writes each frame of a commit to the WAL in two pwrites, its
// 24-byte header and then its page, and then syncs. A commit of 45 frames
// (about three operations, at half load) took 290 µs of CPU in those
// writes against 73 µs for the same bytes in one (a C program, 7 Dec);
// the store's batched benchmark took 9 % less CPU per operation with the
// writes gathered, 15 % with small batches. The bytes, their order and
// the sync are SQLite's; only the number of system calls changes.
//
// It may be used only with synchronous=FULL or EXTRA (fileParams): SQLite
// then syncs the WAL at every commit before it publishes the commit to
// other connections, so a frame that another connection may read has
// always been written out. With NORMAL it would publish frames that are
// still gathered.
//
// A process killed with frames gathered loses them as it would have lost
// frames written but not yet synced: no commit had returned. A write that
// fails when the gathered frames go out fails the sync that asked for it,
// and SQLite rolls the transaction back.
const gatherVFS = "fleetctl-gather"

// gatherErr is SQLite's answer to registering the VFS (0: registered).
// It runs in init, after every package variable, memStatusErr among them:
// registering a VFS initializes SQLite, after which its allocation
// statistics could no longer be turned off.
var gatherErr int

func init() {
	// SQLite keeps the name's pointer for as long as the VFS is
	// registered, that is for good: it is never freed.
	gatherErr = int(C.gatherRegister(C.CString(gatherVFS)))
}

// writerVFS is the writer's DSN parameter that chooses the VFS: none if it
// could not be registered (the writes then go out as SQLite makes them).
func writerVFS() string {
	if gatherErr != 0 {
		return ""
	}
	return "&vfs=" + gatherVFS
}

// gatherCounts are the writes SQLite made to WAL files through the VFS and
// the writes that reached them, since the process started (for tests).
func gatherCounts() (wal, file int64) {
	return int64(C.gatherWalWrites()), int64(C.gatherFileWrites())
}

// gatherFailWrites makes the next n writes that would reach a WAL file
// fail with SQLITE_IOERR_WRITE (for tests).
func gatherFailWrites(n int) { C.gatherFailWrites(C.int(n)) }
