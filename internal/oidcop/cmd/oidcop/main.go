// Command oidcop runs the test OpenID provider of package oidcop for the
// UI's end-to-end tests, which build it with go build; it is never shipped.
//
//	oidcop --listen 127.0.0.1:0 --client-id ID --client-secret S --redirect-uri URL \
//	       --user NAME:PASSWORD:GROUP,GROUP ...
//
// Once it serves it prints "oidcop issuer=URL" and runs until SIGTERM.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sluicehq/sluice/internal/oidcop"
)

// users is a repeated --user flag.
type users []oidcop.User

func (u *users) String() string { return fmt.Sprint(len(*u), " users") }

func (u *users) Set(s string) error {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) < 2 || parts[0] == "" {
		return fmt.Errorf("want NAME:PASSWORD[:GROUP,GROUP], not %q", s)
	}
	user := oidcop.User{Subject: "sub-" + parts[0], Username: parts[0], Password: parts[1], Email: parts[0] + "@example.com"}
	if len(parts) == 3 && parts[2] != "" {
		user.Groups = strings.Split(parts[2], ",")
	}
	*u = append(*u, user)
	return nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	clientID := flag.String("client-id", "sluice-console", "the registered client's ID")
	secret := flag.String("client-secret", "", "the registered client's secret")
	redirect := flag.String("redirect-uri", "", "the registered client's redirect URI")
	var us users
	flag.Var(&us, "user", "an account NAME:PASSWORD:GROUP,GROUP (repeatable)")
	flag.Parse()
	srv, err := oidcop.Start(*listen, []oidcop.Client{{ID: *clientID, Secret: *secret, RedirectURIs: []string{*redirect}}}, us)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("oidcop issuer=%s\n", srv.Issuer)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	srv.Close()
}
