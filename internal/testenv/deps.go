package testenv

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Deps lists the packages pkg links (go list -deps), failing t when go
// list fails. go test puts its own GOROOT/bin first on the test's PATH:
// the toolchain that runs the test lists them.
func Deps(t testing.TB, pkg string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", pkg).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("go list -deps %s: %v: %s", pkg, err, ee.Stderr)
	}
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// Linked returns the packages of deps that are path or below it.
func Linked(deps []string, path string) []string {
	var out []string
	for _, dep := range deps {
		if dep == path || strings.HasPrefix(dep, path+"/") {
			out = append(out, dep)
		}
	}
	return out
}
