// The "gather" VFS: SQLite's default VFS, except that the writes to a WAL
// file are gathered into a buffer and reach the file in one pwrite when it
// is full (30 frames) or anything else is asked of that file (its sync
// above all), rather than in two pwrites a frame (the frame's header, then
// its page). See gather.go.
//
// SQLite's own header is go-sqlite3's and not on the include path, so the
// few declarations used here are written out from SQLite's documented C
// interface (https://sqlite.org/c3ref/vfs.html and io_methods.html); their
// layout has not changed since SQLite 3.7.

#include <stdlib.h>
#include <string.h>

typedef long long sqlite3_int64;
typedef struct sqlite3_file sqlite3_file;
typedef struct sqlite3_io_methods sqlite3_io_methods;
typedef struct sqlite3_vfs sqlite3_vfs;

struct sqlite3_file {
	const sqlite3_io_methods *pMethods;
};

struct sqlite3_io_methods {
	int iVersion;
	int (*xClose)(sqlite3_file *);
	int (*xRead)(sqlite3_file *, void *, int, sqlite3_int64);
	int (*xWrite)(sqlite3_file *, const void *, int, sqlite3_int64);
	int (*xTruncate)(sqlite3_file *, sqlite3_int64);
	int (*xSync)(sqlite3_file *, int);
	int (*xFileSize)(sqlite3_file *, sqlite3_int64 *);
	int (*xLock)(sqlite3_file *, int);
	int (*xUnlock)(sqlite3_file *, int);
	int (*xCheckReservedLock)(sqlite3_file *, int *);
	int (*xFileControl)(sqlite3_file *, int, void *);
	int (*xSectorSize)(sqlite3_file *);
	int (*xDeviceCharacteristics)(sqlite3_file *);
	int (*xShmMap)(sqlite3_file *, int, int, int, void volatile **);
	int (*xShmLock)(sqlite3_file *, int, int, int);
	void (*xShmBarrier)(sqlite3_file *);
	int (*xShmUnmap)(sqlite3_file *, int);
	int (*xFetch)(sqlite3_file *, sqlite3_int64, int, void **);
	int (*xUnfetch)(sqlite3_file *, sqlite3_int64, void *);
};

struct sqlite3_vfs {
	int iVersion;
	int szOsFile;
	int mxPathname;
	sqlite3_vfs *pNext;
	const char *zName;
	void *pAppData;
	int (*xOpen)(sqlite3_vfs *, const char *, sqlite3_file *, int, int *);
	int (*xDelete)(sqlite3_vfs *, const char *, int);
	int (*xAccess)(sqlite3_vfs *, const char *, int, int *);
	int (*xFullPathname)(sqlite3_vfs *, const char *, int, char *);
	void *(*xDlOpen)(sqlite3_vfs *, const char *);
	void (*xDlError)(sqlite3_vfs *, int, char *);
	void (*(*xDlSym)(sqlite3_vfs *, void *, const char *))(void);
	void (*xDlClose)(sqlite3_vfs *, void *);
	int (*xRandomness)(sqlite3_vfs *, int, char *);
	int (*xSleep)(sqlite3_vfs *, int);
	int (*xCurrentTime)(sqlite3_vfs *, double *);
	int (*xGetLastError)(sqlite3_vfs *, int, char *);
	int (*xCurrentTimeInt64)(sqlite3_vfs *, sqlite3_int64 *);
	/* version 3's system-call methods are not offered (iVersion 2) */
};

extern sqlite3_vfs *sqlite3_vfs_find(const char *);
extern int sqlite3_vfs_register(sqlite3_vfs *, int);

#define SQLITE_OK 0
#define SQLITE_ERROR 1
#define SQLITE_IOERR_WRITE (10 | (3 << 8))
#define SQLITE_OPEN_WAL 0x00080000

// GATHER_CAP is the most a WAL file's buffer holds before it is written
// out: 30 frames of 4 KiB pages. The default VFS writes at most 128 KiB
// less one byte in one call (it masks the length with 0x1ffff, and a
// longer write fails as SQLITE_FULL), so a commit of more frames than that
// goes out in several writes: derived from the frames a commit writes
// (about 45 at the bench's half load, 130 to 200 saturated), about two and
// five to seven, against two a frame.
#define GATHER_CAP (30 * (4096 + 24))
_Static_assert(GATHER_CAP <= 0x1ffff, "the default VFS writes it in one call");

// A gathered WAL file: the real file (the default VFS's) follows it in the
// same allocation, of the default VFS's szOsFile (at g + 1: the struct's
// size is a multiple of 8, as SQLite aligns the allocation).
typedef struct gatherFile {
	sqlite3_file base;
	sqlite3_file *real;
	char *buf;               // GATHER_CAP bytes, allocated at the first write
	int len;                 // bytes gathered, from start
	sqlite3_int64 start;     // the file offset of buf[0]
} gatherFile;

static sqlite3_vfs *orig;    // the default VFS
static sqlite3_vfs gather;

// Counters read by the tests (gather.go): writes SQLite made to WAL files,
// and writes that reached them. Only the writer connection writes a WAL.
static long long walWrites, fileWrites;
// failWrites, when above 0, fails that many of the next writes to a WAL
// file with SQLITE_IOERR_WRITE, gathered or not (tests only).
static int failWrites;

_Static_assert(sizeof(gatherFile) % 8 == 0, "the real file follows aligned");

static int realWrite(gatherFile *g, const void *p, int n, sqlite3_int64 off) {
	if (__atomic_load_n(&failWrites, __ATOMIC_RELAXED) > 0) {
		__atomic_fetch_sub(&failWrites, 1, __ATOMIC_RELAXED);
		return SQLITE_IOERR_WRITE;
	}
	__atomic_fetch_add(&fileWrites, 1, __ATOMIC_RELAXED);
	return g->real->pMethods->xWrite(g->real, p, n, off);
}

// flush writes what is gathered. On failure nothing gathered is kept:
// SQLite sees the failure at the call that asked for the flush (the
// commit's sync) and rolls the transaction back; the frames it had written
// were never in the WAL's index.
static int flush(gatherFile *g) {
	if (g->len == 0) {
		return SQLITE_OK;
	}
	int rc = realWrite(g, g->buf, g->len, g->start);
	g->len = 0;
	return rc;
}

static int gClose(sqlite3_file *f) {
	gatherFile *g = (gatherFile *)f;
	int rc = flush(g);
	int rc2 = g->real->pMethods->xClose(g->real);
	free(g->buf);
	g->buf = NULL;
	return rc != SQLITE_OK ? rc : rc2;
}

static int gWrite(sqlite3_file *f, const void *p, int n, sqlite3_int64 off) {
	gatherFile *g = (gatherFile *)f;
	__atomic_fetch_add(&walWrites, 1, __ATOMIC_RELAXED);
	if (g->len > 0 && off == g->start + g->len && n <= GATHER_CAP - g->len) {
		memcpy(g->buf + g->len, p, n);
		g->len += n;
		return SQLITE_OK;
	}
	int rc = flush(g);
	if (rc != SQLITE_OK) {
		return rc;
	}
	if (n > GATHER_CAP / 2) {
		return realWrite(g, p, n, off);
	}
	if (g->buf == NULL && (g->buf = malloc(GATHER_CAP)) == NULL) {
		return realWrite(g, p, n, off);
	}
	memcpy(g->buf, p, n);
	g->start = off;
	g->len = n;
	return SQLITE_OK;
}

// Every other method that reads, sizes, syncs or truncates the file writes
// out what is gathered first, so that SQLite cannot tell the writes were
// late. Other connections read a frame only once a commit has published
// it in the WAL's index, and with synchronous=FULL (the only mode this VFS
// may be used with: gather.go) SQLite syncs the WAL, and so writes out
// what is gathered, before it publishes the commit.

static int gRead(sqlite3_file *f, void *p, int n, sqlite3_int64 off) {
	gatherFile *g = (gatherFile *)f;
	int rc = flush(g);
	return rc != SQLITE_OK ? rc : g->real->pMethods->xRead(g->real, p, n, off);
}

static int gTruncate(sqlite3_file *f, sqlite3_int64 size) {
	gatherFile *g = (gatherFile *)f;
	int rc = flush(g);
	return rc != SQLITE_OK ? rc : g->real->pMethods->xTruncate(g->real, size);
}

static int gSync(sqlite3_file *f, int flags) {
	gatherFile *g = (gatherFile *)f;
	int rc = flush(g);
	return rc != SQLITE_OK ? rc : g->real->pMethods->xSync(g->real, flags);
}

static int gFileSize(sqlite3_file *f, sqlite3_int64 *size) {
	gatherFile *g = (gatherFile *)f;
	int rc = flush(g);
	return rc != SQLITE_OK ? rc : g->real->pMethods->xFileSize(g->real, size);
}

static int gLock(sqlite3_file *f, int level) {
	gatherFile *g = (gatherFile *)f;
	return g->real->pMethods->xLock(g->real, level);
}

static int gUnlock(sqlite3_file *f, int level) {
	gatherFile *g = (gatherFile *)f;
	return g->real->pMethods->xUnlock(g->real, level);
}

static int gCheckReservedLock(sqlite3_file *f, int *out) {
	gatherFile *g = (gatherFile *)f;
	return g->real->pMethods->xCheckReservedLock(g->real, out);
}

static int gFileControl(sqlite3_file *f, int op, void *arg) {
	gatherFile *g = (gatherFile *)f;
	int rc = flush(g);
	return rc != SQLITE_OK ? rc : g->real->pMethods->xFileControl(g->real, op, arg);
}

static int gSectorSize(sqlite3_file *f) {
	gatherFile *g = (gatherFile *)f;
	return g->real->pMethods->xSectorSize(g->real);
}

static int gDeviceCharacteristics(sqlite3_file *f) {
	gatherFile *g = (gatherFile *)f;
	return g->real->pMethods->xDeviceCharacteristics(g->real);
}

static int gShmMap(sqlite3_file *f, int pg, int pgsz, int extend, void volatile **pp) {
	gatherFile *g = (gatherFile *)f;
	return g->real->pMethods->xShmMap(g->real, pg, pgsz, extend, pp);
}

static int gShmLock(sqlite3_file *f, int offset, int n, int flags) {
	gatherFile *g = (gatherFile *)f;
	return g->real->pMethods->xShmLock(g->real, offset, n, flags);
}

// SQLite keeps the WAL's index through the database file's methods, not
// the WAL's: these are never called on a WAL file, but forwarded anyway.
static void gShmBarrier(sqlite3_file *f) {
	gatherFile *g = (gatherFile *)f;
	g->real->pMethods->xShmBarrier(g->real);
}

static int gShmUnmap(sqlite3_file *f, int del) {
	gatherFile *g = (gatherFile *)f;
	return g->real->pMethods->xShmUnmap(g->real, del);
}

static int gFetch(sqlite3_file *f, sqlite3_int64 off, int n, void **pp) {
	gatherFile *g = (gatherFile *)f;
	int rc = flush(g);
	if (rc != SQLITE_OK) {
		return rc;
	}
	if (g->real->pMethods->iVersion < 3) {
		*pp = NULL;
		return SQLITE_OK;
	}
	return g->real->pMethods->xFetch(g->real, off, n, pp);
}

static int gUnfetch(sqlite3_file *f, sqlite3_int64 off, void *p) {
	gatherFile *g = (gatherFile *)f;
	if (g->real->pMethods->iVersion < 3) {
		return SQLITE_OK;
	}
	return g->real->pMethods->xUnfetch(g->real, off, p);
}

static const sqlite3_io_methods gatherMethods = {
	3, gClose, gRead, gWrite, gTruncate, gSync, gFileSize, gLock, gUnlock,
	gCheckReservedLock, gFileControl, gSectorSize, gDeviceCharacteristics,
	gShmMap, gShmLock, gShmBarrier, gShmUnmap, gFetch, gUnfetch,
};

// gOpen opens every file as the default VFS does; a WAL file is wrapped.
// Every other file is the default VFS's own object, in the same space.
static int gOpen(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *outFlags) {
	(void)vfs;
	if ((flags & SQLITE_OPEN_WAL) == 0) {
		return orig->xOpen(orig, name, f, flags, outFlags);
	}
	gatherFile *g = (gatherFile *)f;
	memset(g, 0, sizeof *g);
	g->real = (sqlite3_file *)(g + 1);
	g->real->pMethods = NULL;
	int rc = orig->xOpen(orig, name, g->real, flags, outFlags);
	if (rc != SQLITE_OK) {
		if (g->real->pMethods != NULL) {
			g->real->pMethods->xClose(g->real);
		}
		f->pMethods = NULL;
		return rc;
	}
	f->pMethods = &gatherMethods;
	return SQLITE_OK;
}

static int gDelete(sqlite3_vfs *v, const char *n, int s) { (void)v; return orig->xDelete(orig, n, s); }
static int gAccess(sqlite3_vfs *v, const char *n, int fl, int *o) { (void)v; return orig->xAccess(orig, n, fl, o); }
static int gFullPathname(sqlite3_vfs *v, const char *n, int k, char *o) { (void)v; return orig->xFullPathname(orig, n, k, o); }
static void *gDlOpen(sqlite3_vfs *v, const char *n) { (void)v; return orig->xDlOpen(orig, n); }
static void gDlError(sqlite3_vfs *v, int k, char *o) { (void)v; orig->xDlError(orig, k, o); }
static void (*gDlSym(sqlite3_vfs *v, void *h, const char *s))(void) { (void)v; return orig->xDlSym(orig, h, s); }
static void gDlClose(sqlite3_vfs *v, void *h) { (void)v; orig->xDlClose(orig, h); }
static int gRandomness(sqlite3_vfs *v, int k, char *o) { (void)v; return orig->xRandomness(orig, k, o); }
static int gSleep(sqlite3_vfs *v, int us) { (void)v; return orig->xSleep(orig, us); }
static int gCurrentTime(sqlite3_vfs *v, double *t) { (void)v; return orig->xCurrentTime(orig, t); }
static int gGetLastError(sqlite3_vfs *v, int k, char *o) { (void)v; return orig->xGetLastError(orig, k, o); }
static int gCurrentTimeInt64(sqlite3_vfs *v, sqlite3_int64 *t) { (void)v; return orig->xCurrentTimeInt64(orig, t); }

// gatherRegister registers the VFS under name, beside the default one
// (which stays the default). It returns SQLite's error code.
int gatherRegister(const char *name) {
	orig = sqlite3_vfs_find(NULL);
	if (orig == NULL || orig->iVersion < 2) {
		return SQLITE_ERROR;
	}
	gather.iVersion = 2;
	gather.szOsFile = (int)sizeof(gatherFile) + orig->szOsFile;
	gather.mxPathname = orig->mxPathname;
	gather.zName = name;
	gather.xOpen = gOpen;
	gather.xDelete = gDelete;
	gather.xAccess = gAccess;
	gather.xFullPathname = gFullPathname;
	gather.xDlOpen = gDlOpen;
	gather.xDlError = gDlError;
	gather.xDlSym = gDlSym;
	gather.xDlClose = gDlClose;
	gather.xRandomness = gRandomness;
	gather.xSleep = gSleep;
	gather.xCurrentTime = gCurrentTime;
	gather.xGetLastError = gGetLastError;
	gather.xCurrentTimeInt64 = gCurrentTimeInt64;
	return sqlite3_vfs_register(&gather, 0);
}

long long gatherWalWrites(void) { return __atomic_load_n(&walWrites, __ATOMIC_RELAXED); }
long long gatherFileWrites(void) { return __atomic_load_n(&fileWrites, __ATOMIC_RELAXED); }
void gatherFailWrites(int n) { __atomic_store_n(&failWrites, n, __ATOMIC_RELAXED); }
