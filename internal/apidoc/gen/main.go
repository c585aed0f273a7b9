// Command gen writes the Markdown reference of an OpenAPI document:
//
//	go run ./internal/apidoc/gen -o docs/api.md backend/api/openapi.yaml
//
// `go generate ./internal/apidoc` runs it for docs/api.md.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/sluicehq/sluice/internal/apidoc"
)

func main() {
	out := flag.String("o", "", "file to write (default: standard output)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: gen [-o FILE] OPENAPI.yaml")
		os.Exit(2)
	}
	src, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	md, err := apidoc.Render(src)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gen: %s: %v\n", flag.Arg(0), err)
		os.Exit(1)
	}
	if *out == "" {
		_, err = os.Stdout.Write(md)
	} else {
		err = os.WriteFile(*out, md, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
