package erasure

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/peers"
)

// Handler serves the admin API under /api/v1/admin/ (behind an auth
// middleware requiring the admin permission):
//
//	POST /api/v1/admin/erase        {"tenant", "cluster_id" | "selector", "deny", "requested_by"} → 202, the job
//	GET  /api/v1/admin/erase        the caller's tenant's jobs
//	GET  /api/v1/admin/erase/<id>   one job's progress
//	POST /api/v1/admin/readmit      {"tenant", "cluster_id", "requested_by"}
//
// An admin credential acts on its own tenant only; an empty tenant means it.
//
// With a Repeater (nil: a single receiver), an erasure or re-admission taken
// here is repeated on every other replica, and the answer lists each
// replica's result ("replicas"), with a warning for each that did not take
// it (the Repeater retries it there). A call repeated by a replica is not
// repeated again.
func (e *Eraser) Handler(replicas *Repeater) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+erasePath, func(w http.ResponseWriter, r *http.Request) {
		var req Request
		if !decode(w, r, &req) {
			return
		}
		if !ownTenant(w, r, &req.Tenant) {
			return
		}
		req.Caller = caller(r)
		st, err := e.Submit(req)
		switch {
		case errors.Is(err, ErrInvalid):
			apiError(w, http.StatusBadRequest, err.Error())
		case errors.Is(err, ErrQueueFull):
			w.Header().Set("Retry-After", "60")
			apiError(w, http.StatusServiceUnavailable, err.Error())
		case err != nil:
			apiError(w, http.StatusInternalServerError, err.Error())
		default:
			results, warnings := replicas.repeat(r, erasePath, req)
			respond(w, http.StatusAccepted, submitted{Status: st, Replicas: results}, warnings...)
		}
	})
	mux.HandleFunc("GET "+erasePath, func(w http.ResponseWriter, r *http.Request) {
		id, _ := auth.FromContext(r.Context())
		jobs := e.List(id.Tenant)
		if jobs == nil {
			jobs = []Status{}
		}
		respond(w, http.StatusOK, jobs)
	})
	mux.HandleFunc("GET "+erasePath+"/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, _ := auth.FromContext(r.Context())
		st, ok := e.Get(r.PathValue("id"))
		if !ok || st.Tenant != id.Tenant {
			apiError(w, http.StatusNotFound, "no such erasure job")
			return
		}
		respond(w, http.StatusOK, st)
	})
	mux.HandleFunc("POST "+readmitPath, func(w http.ResponseWriter, r *http.Request) {
		var req Request
		if !decode(w, r, &req) || !ownTenant(w, r, &req.Tenant) {
			return
		}
		if req.ClusterID == "" {
			apiError(w, http.StatusBadRequest, "cluster_id is required")
			return
		}
		ok, err := e.Readmit(req.Tenant, req.ClusterID, req.RequestedBy, caller(r))
		if err != nil {
			apiError(w, http.StatusInternalServerError, err.Error())
			return
		}
		results, warnings := replicas.repeat(r, readmitPath, req)
		respond(w, http.StatusOK, readmitted{Readmitted: ok, Replicas: results}, warnings...)
	})
	return mux
}

// The paths of the calls a Repeater repeats.
const (
	erasePath   = "/api/v1/admin/erase"
	readmitPath = "/api/v1/admin/readmit"
)

// Patterns are the routes Handler serves, for a mux in front of it: a
// method it does not serve is answered there, before authentication.
var Patterns = []string{"POST " + erasePath, "GET " + erasePath, "GET " + erasePath + "/{id}", "POST " + readmitPath}

// maxRequestBytes bounds an admin request's JSON body: a few short fields.
const maxRequestBytes = 64 << 10

// decode reads the JSON body into v: 415 if it is not JSON, 413 over
// maxRequestBytes (a body cut at the limit would read as malformed), 400
// if it does not decode.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		apiError(w, http.StatusUnsupportedMediaType, "want application/json")
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			apiError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds the limit of %d bytes", tooLarge.Limit))
			return false
		}
		apiError(w, http.StatusBadRequest, "decode request: "+err.Error())
		return false
	}
	return true
}

// ownTenant fills an empty tenant with the caller's and refuses another.
func ownTenant(w http.ResponseWriter, r *http.Request, tenant *string) bool {
	id, _ := auth.FromContext(r.Context())
	if *tenant == "" {
		*tenant = id.Tenant
	}
	if *tenant != id.Tenant {
		apiError(w, http.StatusForbidden, "an admin credential acts on its own tenant only")
		return false
	}
	return true
}

// caller names who called, for the audit event: the admin credential's
// tenant and the client's address.
func caller(r *http.Request) string {
	id, _ := auth.FromContext(r.Context())
	if r.Header.Get(peers.OriginHeader) != "" {
		return "admin of " + id.Tenant + ", repeated by the replica at " + r.RemoteAddr
	}
	return "admin of " + id.Tenant + " from " + r.RemoteAddr
}

// submitted is the answer to an erasure: the job, and the other replicas'.
type submitted struct {
	Status
	Replicas []ReplicaResult `json:"replicas,omitempty"`
}

// readmitted is the answer to a re-admission.
type readmitted struct {
	Readmitted bool            `json:"readmitted"`
	Replicas   []ReplicaResult `json:"replicas,omitempty"`
}

// envelope is the admin API's answer, as Prometheus' API wraps its data:
// respond and apiError write it, replicaResult reads a replica's.
type envelope[T any] struct {
	Status   string   `json:"status"`
	Data     T        `json:"data,omitempty"`
	Error    string   `json:"error,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

func respond(w http.ResponseWriter, code int, data any, warnings ...string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(envelope[any]{Status: "success", Data: data, Warnings: warnings})
}

func apiError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(envelope[any]{Status: "error", Error: msg})
}
