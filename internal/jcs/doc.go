// Package jcs implements the JSON Canonicalization Scheme (JCS) of RFC 8785.
//
// The controller hashes canonical JSON wherever two spellings of the same
// value must compare equal: request_hash is the SHA-256 of the JCS of
// {action, target, params}, and plan_hash the SHA-256 of the JCS of a plan's
// steps array (see docs/api.md). A retry whose body differs only in member
// order, whitespace, string escapes or number spelling ("1.0", "1", "1e0")
// therefore hashes the same, and a retry with other params does not.
//
// # Output
//
// Canonicalize turns any JSON text into its canonical form:
//
//   - no whitespace between tokens;
//   - object members sorted by name, names compared as arrays of UTF-16 code
//     units (so U+1F600, a surrogate pair D83D DE00, sorts before U+FB33);
//   - strings as ECMAScript's JSON.stringify writes them: only '"', '\\' and
//     the control characters below U+0020 are escaped, as \b \f \n \r \t
//     where those exist and as \u00xx (lowercase hex) otherwise; everything
//     else, U+007F, U+2028 and U+2029 included, is raw UTF-8;
//   - numbers parsed as IEEE-754 doubles and written by the ECMAScript
//     Number-to-String algorithm: the shortest digits that round-trip, in
//     integer form below 1e21 ("123456789012345680000"), in fraction form
//     down to 1e-6 ("0.000001"), in exponent form otherwise ("1e+21",
//     "1e-7"); -0 is written "0";
//   - the literals true, false and null.
//
// # Rejected input
//
// Canonicalize fails, and never guesses, on input outside the I-JSON data
// model that RFC 8785 builds on: text that is not one valid JSON value
// (ErrSyntax), an object with two members of the same name after escapes are
// decoded (ErrDuplicateName), a number that is not a finite double, such as
// 1e400 (ErrNumber), and text that is not valid Unicode: invalid UTF-8
// anywhere, or a \uXXXX surrogate escape in a string that is not half of a
// pair (ErrString).
// Numbers too small for a double (1e-400) round to 0, as they do in
// ECMAScript's JSON.parse.
//
// Number text is parsed once, by strconv.ParseFloat, from a json.Decoder that
// uses UseNumber; no value passes through float64 and back before that.
package jcs
