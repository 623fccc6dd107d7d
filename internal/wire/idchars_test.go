package wire

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// IDChars agrees with the regular expressions it replaces, on chosen
// strings and on random ones over a charset with the edges (':', '/', ' ',
// a multi-byte rune, a NUL) and lengths around the limits.
func TestIDCharsAgreesWithTheRegexps(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		max   int
		colon bool
		re    *regexp.Regexp
	}{
		{64, false, regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)},
		{200, true, regexp.MustCompile(`^[A-Za-z0-9._:-]{1,200}$`)},
		{400, true, regexp.MustCompile(`^[A-Za-z0-9._:-]{1,400}$`)},
	} {
		check := func(s string) {
			require.Equal(t, tc.re.MatchString(s), IDChars(s, tc.max, tc.colon), "%q (max %d, colon %v)", s, tc.max, tc.colon)
		}
		for _, s := range []string{"", "a", "device-1", "a:b", "a/b", "a b", "é", "a\x00", "\n", "a\n",
			strings.Repeat("x", tc.max), strings.Repeat("x", tc.max+1), strings.Repeat("é", tc.max/2)} {
			check(s)
		}
		chars := []rune("aZ09._-:/ é\x00")
		r := rand.New(rand.NewPCG(1, uint64(tc.max)))
		for range 20000 {
			n := r.IntN(tc.max + 3)
			if r.IntN(2) == 0 {
				n = r.IntN(8)
			}
			var b strings.Builder
			for range n {
				c := chars[r.IntN(len(chars))]
				if r.IntN(4) != 0 {
					c = chars[r.IntN(7)] // mostly the charset
				}
				b.WriteRune(c)
			}
			check(b.String())
		}
	}
}
