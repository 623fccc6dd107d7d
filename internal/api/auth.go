package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
)

// Roles.
const (
	RoleOperator = "operator"
	RoleApprover = "approver"
	RoleAdmin    = "admin"
)

// Token is one entry of the --tokens file.
type Token struct {
	Token     string   `json:"token"`
	Principal string   `json:"principal"`
	Roles     []string `json:"roles"`
}

// Auth holds the tokens; a nil *Auth means auth is off: every caller is
// anonymous with every role, grants are not enforced, four-eyes is off.
type Auth struct{ tokens []Token }

// LoadTokens reads a JSON array of tokens.
func LoadTokens(path string) (*Auth, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	var tokens []Token
	if err := json.Unmarshal(raw, &tokens); err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	for i, t := range tokens {
		if t.Token == "" || t.Principal == "" {
			return nil, fmt.Errorf("tokens file %s: entry %d needs token and principal", path, i)
		}
		for _, r := range t.Roles {
			if r != RoleOperator && r != RoleApprover && r != RoleAdmin {
				return nil, fmt.Errorf("tokens file %s: entry %d: unknown role %q", path, i, r)
			}
		}
	}
	return &Auth{tokens: tokens}, nil
}

// Enabled reports whether tokens are checked.
func (a *Auth) Enabled() bool { return a != nil }

func (a *Auth) lookup(bearer string) (Token, bool) {
	for _, t := range a.tokens {
		if subtle.ConstantTimeCompare([]byte(t.Token), []byte(bearer)) == 1 {
			return t, true
		}
	}
	return Token{}, false
}

type principalKey struct{}

// principal names the caller ("anonymous" without --tokens).
func principal(r *http.Request) string {
	if p, ok := r.Context().Value(principalKey{}).(string); ok {
		return p
	}
	return "anonymous"
}

// need wraps a handler with the contract's auth: 401 unauthorized without a
// valid bearer token, 403 forbidden without the role ("" = any valid token).
func (s *Server) need(role string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.cfg.Auth.Enabled() {
			h(w, r)
			return
		}
		// The scheme is case-insensitive (RFC 7235 section 2.1).
		scheme, bearer, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		ok = ok && strings.EqualFold(scheme, "Bearer")
		tok, found := s.cfg.Auth.lookup(strings.TrimSpace(bearer))
		if !ok || !found {
			s.writeError(w, apiErr(http.StatusUnauthorized, "unauthorized", "a valid bearer token is required"))
			return
		}
		if role != "" && !slices.Contains(tok.Roles, role) && !slices.Contains(tok.Roles, RoleAdmin) {
			s.writeError(w, apiErr(http.StatusForbidden, "forbidden", tok.Principal+" lacks the "+role+" role"))
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, tok.Principal)))
	}
}

// ViaHeader names the channel a submit came through (apiwire.ViaHeader).
const ViaHeader = apiwire.ViaHeader

// channel is the via of a submit: api, or mcp when ViaHeader says so;
// any other value is refused.
func channel(r *http.Request) (string, error) {
	switch v := r.Header.Get(ViaHeader); v {
	case "":
		return domain.ViaAPI, nil
	case domain.ViaMCP:
		return domain.ViaMCP, nil
	default:
		return "", apiErr(http.StatusBadRequest, "invalid_request", ViaHeader+" "+shorten(v)+": only mcp (the MCP server's requests), or none")
	}
}
