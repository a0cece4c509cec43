# Build and install berth: the SPANK plugin, the CLI and the plugstack drop-in.
#
#   make                      build (release)
#   make install              install under PREFIX (default /usr/local)
#   make install-built        the same, from what an earlier build left in
#                             TARGET_DIR, without running cargo (tests/release.sh)
#   make install PREFIX=/opt/berth PLUGSTACK_DIR=/etc/slurm/plugstack.conf.d
#   make deb                  a Debian package in target/debian (packaging/deb.sh)
#   make rpm                  an RPM in target/rpm (packaging/rpm.sh, packaging/berth.spec)
#
# Both package for the Slurm whose headers berth is built against:
# SLURM_INCLUDE_DIR (default /usr/include), passed on to cargo.
#
# PLUGSTACK_DIR, when set, also receives the drop-in (berth.conf), rewritten
# for PREFIX. DESTDIR is honoured for packaging.
#
# `make install` (as root, without DESTDIR) also creates the system user
# PULL_USER (default berth) that image pulls run as, when it is missing
# (plugstack `pull_user`; docs/INSTALL.md).

PREFIX        ?= /usr/local
BINDIR        ?= $(PREFIX)/bin
PLUGINDIR     ?= $(PREFIX)/lib/slurm
DATADIR       ?= $(PREFIX)/share/berth
PLUGSTACK_DIR ?=
CARGO         ?= cargo
TARGET_DIR    ?= target
PULL_USER     ?= berth


.PHONY: all build install install-built uninstall deb rpm test clean

all: build

build:
	$(CARGO) build --release --locked --target-dir $(TARGET_DIR)

install: build
	$(MAKE) --no-print-directory install-built

install-built:
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(DATADIR)
	install -m 0755 $(TARGET_DIR)/release/berth $(DESTDIR)$(BINDIR)/berth
	install -m 0755 $(TARGET_DIR)/release/libberth.so $(DESTDIR)$(PLUGINDIR)/spank_berth.so
	sed -e 's|/usr/local/lib/slurm/|$(PLUGINDIR)/|; s|/usr/local/bin/berth|$(BINDIR)/berth|' \
		plugstack.conf.d/berth.conf > $(DESTDIR)$(DATADIR)/berth.conf
	if [ -n "$(PLUGSTACK_DIR)" ]; then \
		install -d $(DESTDIR)$(PLUGSTACK_DIR) && \
		install -m 0644 $(DESTDIR)$(DATADIR)/berth.conf $(DESTDIR)$(PLUGSTACK_DIR)/berth.conf; \
	fi
	if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && ! id -u $(PULL_USER) >/dev/null 2>&1; then \
		useradd --system --user-group --no-create-home --home-dir /nonexistent \
			--shell /usr/sbin/nologin --comment 'berth image puller' $(PULL_USER) && \
		echo "created the system user $(PULL_USER) that berth pulls images as"; \
	fi

deb:
	TARGET_DIR=$(TARGET_DIR) packaging/deb.sh

rpm:
	TARGET_DIR=$(TARGET_DIR) packaging/rpm.sh

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/berth $(DESTDIR)$(PLUGINDIR)/spank_berth.so $(DESTDIR)$(DATADIR)/berth.conf
	if [ -n "$(PLUGSTACK_DIR)" ]; then rm -f $(DESTDIR)$(PLUGSTACK_DIR)/berth.conf; fi

clean:
	$(CARGO) clean --target-dir $(TARGET_DIR)
