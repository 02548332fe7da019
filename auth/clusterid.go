package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
)

// pseudonymRE is the shape of a keyed-hash cluster id, the forwarder's and
// ClusterIDHasher's alike: 16 bytes of HMAC-SHA256, base64url without
// padding. A raw OpenShift cluster id is a UUID, which never has it.
var pseudonymRE = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)

// ClusterIDHasher turns the cluster ids that clusters send in clear (the
// Telemeter paths: telemeter-client's /authorize id and the cluster_id of
// Prometheus' telemetry remote-write) into pseudonyms before anything
// stores or logs them.
type ClusterIDHasher struct {
	key    []byte
	sealer *idSealer // seals the raw id into the credential of its pseudonym (Issuer)
	// RefusePseudonyms refuses a cluster id sent with the pseudonym's shape
	// at /authorize and on Telemeter's write path, instead of keeping it:
	// for fleets whose clusters all send raw ids (no forwarder), so that no
	// client can present a stored id, which readers of fleet data see.
	// Set it before the hasher is used.
	RefusePseudonyms bool
}

// errSentPseudonym refuses a pseudonym-shaped id under RefusePseudonyms.
var errSentPseudonym = errors.New("the cluster id has the shape of a stored pseudonym (22 base64url characters), and this receiver takes only raw cluster ids (auth.cluster_id_hash.pseudonyms: refuse)")

// LoadClusterIDHasher reads the HMAC key from path (trailing newlines
// trimmed); it must have at least 16 bytes.
func LoadClusterIDHasher(path string) (*ClusterIDHasher, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cluster id hash key: %w", err)
	}
	return NewClusterIDHasher([]byte(strings.TrimRight(string(b), "\r\n")))
}

// NewClusterIDHasher returns a hasher keyed with key (at least 16 bytes).
func NewClusterIDHasher(key []byte) (*ClusterIDHasher, error) {
	if len(key) < 16 {
		return nil, fmt.Errorf("cluster id hash key has %d bytes, want at least 16", len(key))
	}
	sealer, err := newIDSealer(key)
	if err != nil {
		return nil, err
	}
	return &ClusterIDHasher{key: append([]byte(nil), key...), sealer: sealer}, nil
}

// Pseudonym returns the id to store for a cluster that sent id:
// base64url(HMAC-SHA256(key, id)[:16]), the forwarder's encoding. An id
// that already has that shape (a forwarder's pseudonym) is kept as it is,
// so clusters moving to the forwarder are not hashed twice.
func (h *ClusterIDHasher) Pseudonym(id string) string {
	if pseudonymRE.MatchString(id) {
		return id
	}
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// ids returns the ids of a cluster that sent id: the pseudonym is stored,
// or, with a nil h (no cluster_id_hash), the id as sent. Under
// RefusePseudonyms a pseudonym-shaped id is errSentPseudonym.
func (h *ClusterIDHasher) ids(sent string) (ClusterIDs, error) {
	if h == nil {
		return ClusterIDs{Sent: sent, Stored: sent}, nil
	}
	if h.RefusePseudonyms && pseudonymRE.MatchString(sent) {
		return ClusterIDs{}, errSentPseudonym
	}
	return ClusterIDs{Sent: sent, Stored: h.Pseudonym(sent)}, nil
}

// PseudonymTokens binds a static token bound to a cluster's raw id (a
// tokens file may name either form, see Tokens.AuthorizeFleet) to its
// pseudonym, as the Telemeter paths bind theirs: writes with it store the
// pseudonym, and series that carry the raw _id are rewritten
// (Identity.ClusterIDAlias).
// Without it such a token wrote the raw id to the WAL and the blocks.
type PseudonymTokens struct {
	Authenticator
	Hasher *ClusterIDHasher
}

// Authenticate implements Authenticator.
func (p PseudonymTokens) Authenticate(r *http.Request) (Identity, error) {
	id, err := p.Authenticator.Authenticate(r)
	if err != nil || id.ClusterID == "" {
		return id, err
	}
	if ps := p.Hasher.Pseudonym(id.ClusterID); ps != id.ClusterID {
		id.ClusterID, id.ClusterIDAlias = ps, id.ClusterID
	}
	return id, nil
}
