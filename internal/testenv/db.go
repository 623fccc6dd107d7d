package testenv

import (
	"database/sql"
	"testing"

	_ "github.com/mattn/go-sqlite3" // the sqlite3 driver
)

// OpenWriter opens a database file for writing behind the controller's
// back: only tests that corrupt a run on purpose use it.
func OpenWriter(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	return db
}
