package auth

import (
	"errors"
	"fmt"
)

// errLacksPermission marks a refusal of Middleware's own permission check,
// as opposed to one of the Authenticator: only then does the token's allow
// list decide, and the 403 says which permission to give it.
var errLacksPermission = fmt.Errorf("credential lacks the permission: %w", ErrForbidden)

// errMayNotAuthorize is Tokens.AuthorizeFleet's refusal of a token without
// the authorize permission: /authorize and Telemeter's write path, which
// take only fleet tokens, say so. It is not errLacksPermission: on
// Telemeter's path the write permission would not help.
var errMayNotAuthorize = fmt.Errorf("token lacks the authorize permission: %w", ErrForbidden)

// errCredentialExpired refuses a cluster credential past its expiry: the
// cluster authorizes again for a new one, as telemeter-client and the
// forwarder do on a 401.
var errCredentialExpired = fmt.Errorf("cluster credential expired: %w", ErrUnauthorized)

// errFleetRefused marks a refusal of the fleet authorizer on Telemeter's
// write path (its 401 or 403, an unknown token), so that the answer says
// who refused what, rather than that a bearer token is required.
var errFleetRefused = errors.New("the fleet authorizer refused the bearer's authorization_token")

// permActions says what the permissions Middleware checks let a credential
// do, in the words of the paths they open.
var permActions = map[Permission]string{
	PermWrite: "write series",
	PermRead:  "read",
	PermPush:  "push",
	PermAdmin: "use the admin API",
}

// forbiddenMessage is the 403 body for a credential refused need. For a
// refusal of the permission check (err wraps errLacksPermission) it names
// the allow list entry the token lacks, and tells a fleet token refused a
// write what it is for.
func forbiddenMessage(need, have Permission, err error) string {
	action, ok := permActions[need]
	if !ok {
		action = "do this"
	}
	msg := "forbidden: this credential may not " + action
	if errors.Is(err, errMayNotAuthorize) { // Telemeter's write path
		return msg + ": its authorization_token lacks the authorize permission (allow: [authorize]): only fleet tokens are taken here"
	}
	if errors.Is(err, errFleetRefused) {
		return msg + ": the fleet authorizer refused this cluster_id for the bearer's authorization_token"
	}
	if !errors.Is(err, errLacksPermission) {
		return msg
	}
	if ok {
		msg += " (allow: [" + need.String() + "])"
	}
	if need == PermWrite && have&PermAuthorize != 0 {
		msg += "; it is a fleet token: exchange it at POST /authorize for a cluster credential, which writes (/authorize needs auth.keys_file on the receiver)"
	}
	return msg
}

// TelemeterBearerError is a bearer of Telemeter's remote-write path that
// is not base64(JSON{"authorization_token", "cluster_id"}). Reason never
// quotes the bearer. It is ErrUnauthorized.
type TelemeterBearerError struct{ Reason string }

func (e *TelemeterBearerError) Error() string { return "telemeter bearer " + e.Reason }

// Unwrap makes the error ErrUnauthorized.
func (e *TelemeterBearerError) Unwrap() error { return ErrUnauthorized }

// unauthorizedMessage is the 401 body: what was wrong with the bearer, or
// what it must be. It never quotes the bearer or a cluster id.
func unauthorizedMessage(err error) string {
	tb := (*TelemeterBearerError)(nil)
	switch {
	case errors.As(err, &tb):
		return `unauthorized: the bearer must be base64 of JSON {"authorization_token": <fleet token>, "cluster_id": <cluster id>}, as telemeter-client and cluster-monitoring-operator send it: ` + tb.Error()
	case errors.Is(err, errSentPseudonym): // as /authorize says it, but 401: Prometheus drops the batch, as for any refused bearer
		return "unauthorized: the bearer's cluster_id: " + errSentPseudonym.Error()
	case errors.Is(err, errFleetRefused):
		return "unauthorized: " + errFleetRefused.Error() + " (an unknown or revoked token)"
	case errors.Is(err, errCredentialExpired):
		return "unauthorized: the cluster credential has expired: authorize again at POST /authorize for a new one"
	case errors.Is(err, errSealedID):
		return "unauthorized: the cluster credential was issued under another auth.cluster_id_hash key: authorize again at POST /authorize for a new one"
	}
	return "unauthorized: a valid bearer token is required"
}
