package status

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed ui
var uiFiles embed.FS

// UIPatterns are the page's routes: the page itself and its assets.
var UIPatterns = []string{"GET /{$}", "GET /status/static/"}

// securityHeaders are sent with the page and its assets: no script but
// ours (no inline script at all), no framing, nothing from elsewhere, so
// the page works air-gapped and cannot be clickjacked.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
	"X-Frame-Options":        "DENY",
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
}

// UI serves the page (GET /) and its assets (GET /status/static/...). It
// holds no data, so it needs no credential: the page asks the API with the
// token the user enters.
func (s *Status) UI() http.Handler {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	static := http.StripPrefix("/status/static/", http.FileServerFS(sub))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		setHeaders(w)
		w.Header().Set("Cache-Control", "no-store")
		http.ServeFileFS(w, r, sub, "index.html")
	})
	mux.HandleFunc("GET /status/static/", func(w http.ResponseWriter, r *http.Request) {
		setHeaders(w)
		static.ServeHTTP(w, r)
	})
	return mux
}

func setHeaders(w http.ResponseWriter) {
	for k, v := range securityHeaders {
		w.Header().Set(k, v)
	}
}
