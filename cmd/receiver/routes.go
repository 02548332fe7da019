package main

import (
	"net/http"
	"slices"
	"strings"
)

// router is the receiver's http.ServeMux, except that a request whose path
// is routed only for other methods (GET /api/v1/write) is answered 405 with
// Allow before any handler, and so before authentication, runs.
// http.ServeMux does that only when no other pattern matches the path,
// which the method-less catch-alls ("/api/v1/", "/api/v1/admin/") always
// do: a GET of the write endpoint would reach the query API's
// authentication (403 for a write token) and then its 404. An unknown path
// is still 404. Register every route before serving.
type router struct {
	mux     *http.ServeMux
	methods []string // of the patterns that name one
}

func newRouter() *router { return &router{mux: http.NewServeMux()} }

// Handle registers h for pattern, as http.ServeMux.Handle does.
func (rt *router) Handle(pattern string, h http.Handler) {
	rt.mux.Handle(pattern, h)
	if method, _, ok := strings.Cut(pattern, " "); ok && !slices.Contains(rt.methods, method) {
		rt.methods = append(rt.methods, method)
		slices.Sort(rt.methods)
	}
}

// HandleFunc registers f for pattern.
func (rt *router) HandleFunc(pattern string, f func(http.ResponseWriter, *http.Request)) {
	rt.Handle(pattern, http.HandlerFunc(f))
}

func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Only a method-less pattern can take a path routed for other
	// methods (ServeMux answers 405 itself when none matches).
	if _, p := rt.mux.Handler(r); p != "" && !hasMethod(p) {
		if allow := rt.allowed(r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			http.Error(w, "method "+r.Method+" is not allowed on "+r.URL.Path+": use "+strings.Join(allow, " or "), http.StatusMethodNotAllowed)
			return
		}
	}
	rt.mux.ServeHTTP(w, r)
}

// allowed returns the methods that a pattern naming them routes r's path
// with: as ServeMux picks the most specific pattern, each is more specific
// than the method-less one r matched.
func (rt *router) allowed(r *http.Request) []string {
	var allow []string
	probe := *r
	for _, m := range rt.methods {
		probe.Method = m
		if _, p := rt.mux.Handler(&probe); hasMethod(p) {
			allow = append(allow, m)
			if m == http.MethodGet { // as ServeMux routes it
				allow = append(allow, http.MethodHead)
			}
		}
	}
	slices.Sort(allow)
	return allow
}

// hasMethod reports whether a ServeMux pattern names a method.
func hasMethod(pattern string) bool { return strings.Contains(pattern, " ") }
