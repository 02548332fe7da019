package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"

	"github.com/phonehome/phonehome/internal/strictyaml"
)

// TokensFile is the on-disk format of the tokens file:
//
//	tokens:
//	  - token_sha256: 9f86d0...   # hex SHA-256 of the bearer token (preferred)
//	    tenant: acme
//	  - token: plaintext-token     # or the token itself
//	    tenant: acme
//	    cluster_id: 3kq...         # optional: bind writes to this _id (then it may only write, authorize and push)
//	    allow: [authorize]         # optional: write, read, authorize, push, admin, fleet_status (default: the first four; bound: write, authorize, push)
//	    name: fleet                # optional: how warnings name the token (never the token itself)
type TokensFile struct {
	Tokens []TokenEntry `yaml:"tokens"`
}

// TokenEntry maps one bearer token to an identity.
type TokenEntry struct {
	Token       string   `yaml:"token,omitempty"`
	TokenSHA256 string   `yaml:"token_sha256,omitempty"`
	Tenant      string   `yaml:"tenant"`
	ClusterID   string   `yaml:"cluster_id,omitempty"`
	Allow       []string `yaml:"allow,omitempty"`
	// Name is how the receiver's warnings refer to the token, next to
	// its index. It is not a secret: comments are not used for this, as
	// they may hold the plaintext of a token_sha256.
	Name string `yaml:"name,omitempty"`
}

// tenantRE keeps tenants safe as directory names and label values.
var tenantRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ValidTenant reports whether name may be used as a tenant.
func ValidTenant(name string) bool { return tenantRE.MatchString(name) && name != "." && name != ".." }

// Tokens authenticates static bearer tokens. Only SHA-256 digests are kept in
// memory; every request is compared against every digest in constant time.
type Tokens struct {
	entries []tokenDigest
}

type tokenDigest struct {
	sum  [sha256.Size]byte
	id   Identity
	name string // for warnings: tokens[i], and the entry's name if any
}

// LoadTokensFile reads and validates a tokens file, naming every problem.
func LoadTokensFile(path string) (*Tokens, error) {
	t, _, err := loadTokensFile(path)
	return t, err
}

// loadTokensFile is LoadTokensFile that also returns the digest of the
// file's content (FileTokens: has it changed?).
func loadTokensFile(path string) (*Tokens, [sha256.Size]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("read tokens file: %w", err)
	}
	t, err := parseTokensFile(path, b)
	return t, sha256.Sum256(b), err
}

// parseTokensFile parses the content b of the tokens file at path.
func parseTokensFile(path string, b []byte) (*Tokens, error) {
	var f TokensFile
	if err := strictyaml.Decode(b, &f); err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	t, err := NewTokens(f.Tokens)
	if err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return t, nil
}

// NewTokens validates entries and builds a Tokens authenticator.
func NewTokens(entries []TokenEntry) (*Tokens, error) {
	var errs []error
	t := &Tokens{}
	seen := map[[sha256.Size]byte]int{}
	if len(entries) == 0 {
		errs = append(errs, errors.New("tokens: at least one token is required"))
	}
	for i, e := range entries {
		path := fmt.Sprintf("tokens[%d]", i)
		var sum [sha256.Size]byte
		switch {
		case e.Token != "" && e.TokenSHA256 != "":
			errs = append(errs, fmt.Errorf("%s: set token or token_sha256, not both", path))
			continue
		case e.Token != "" && looksLikeJWT(e.Token):
			errs = append(errs, fmt.Errorf("%s.token: has the shape of a signed credential (two dots) and would never match", path))
			continue
		case e.Token != "":
			sum = sha256.Sum256([]byte(e.Token))
		case e.TokenSHA256 != "":
			raw, err := hex.DecodeString(e.TokenSHA256)
			if err != nil || len(raw) != sha256.Size {
				errs = append(errs, fmt.Errorf("%s.token_sha256: want 64 hex digits", path))
				continue
			}
			copy(sum[:], raw)
		default:
			errs = append(errs, fmt.Errorf("%s: token or token_sha256 is required", path))
			continue
		}
		if !ValidTenant(e.Tenant) {
			errs = append(errs, fmt.Errorf("%s.tenant: %q must match %s", path, e.Tenant, tenantRE))
		}
		allow := PermAll
		if e.ClusterID != "" {
			allow = PermCluster
		}
		if len(e.Allow) > 0 {
			allow = 0
			for k, a := range e.Allow {
				p, ok := permNames[a]
				if !ok {
					errs = append(errs, fmt.Errorf("%s.allow[%d]: %q, want one of %s", path, k, a, strings.Join(permOrder, ", ")))
				}
				allow |= p
			}
			if extra := allow &^ PermCluster; e.ClusterID != "" && extra != 0 {
				errs = append(errs, fmt.Errorf("%s.allow: a token bound to a cluster (cluster_id) may only write, authorize and push, not %s: what it reads is not limited to its cluster; give readers a token of their own", path, extra))
			}
		}
		if j, dup := seen[sum]; dup {
			errs = append(errs, fmt.Errorf("%s: same token as tokens[%d]", path, j))
		}
		seen[sum] = i
		name := path
		if e.Name != "" {
			name += fmt.Sprintf(" (%q)", e.Name)
		}
		t.entries = append(t.entries, tokenDigest{sum: sum, id: Identity{Tenant: e.Tenant, ClusterID: e.ClusterID, Allow: allow}, name: name})
	}
	for i, e := range entries { // once every token is known: a name may be another entry's
		j, ok := seen[sha256.Sum256([]byte(e.Name))]
		switch {
		case e.Name == "" || !ok:
		case j == i:
			errs = append(errs, fmt.Errorf("tokens[%d].name: is the token itself, and names are logged", i))
		default:
			errs = append(errs, fmt.Errorf("tokens[%d].name: is the token of tokens[%d], and names are logged", i, j))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// Authenticate implements Authenticator.
func (t *Tokens) Authenticate(r *http.Request) (Identity, error) {
	token, ok := bearerToken(r)
	if !ok {
		return Identity{}, fmt.Errorf("no bearer token: %w", ErrUnauthorized)
	}
	return t.lookup(token)
}

// lookup finds the identity of token, comparing digests in constant time.
func (t *Tokens) lookup(token string) (Identity, error) {
	sum := sha256.Sum256([]byte(token))
	found := -1
	for i := range t.entries {
		// No early exit: the time taken does not depend on which entry matched.
		if subtle.ConstantTimeCompare(sum[:], t.entries[i].sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Identity{}, fmt.Errorf("unknown token: %w", ErrUnauthorized)
	}
	return t.entries[found].id, nil
}
