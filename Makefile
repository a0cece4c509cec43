# Build and install berth: the SPANK plugin, the CLI and the plugstack drop-in.
#
#   make                      build (release)
#   make install              install under PREFIX (default /usr/local)
#   make install PREFIX=/opt/berth PLUGSTACK_DIR=/etc/slurm/plugstack.conf.d
#   make deb                  a Debian package in target/debian (packaging/deb.sh)
#
# PLUGSTACK_DIR, when set, also receives the drop-in (berth.conf), rewritten
# for PREFIX. DESTDIR is honoured for packaging.

PREFIX        ?= /usr/local
BINDIR        ?= $(PREFIX)/bin
PLUGINDIR     ?= $(PREFIX)/lib/slurm
DATADIR       ?= $(PREFIX)/share/berth
PLUGSTACK_DIR ?=
CARGO         ?= cargo
TARGET_DIR    ?= target


.PHONY: all build install uninstall deb test clean

all: build

build:
	$(CARGO) build --release --locked --target-dir $(TARGET_DIR)

install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(DATADIR)
	install -m 0755 $(TARGET_DIR)/release/berth $(DESTDIR)$(BINDIR)/berth
	install -m 0755 $(TARGET_DIR)/release/libberth.so $(DESTDIR)$(PLUGINDIR)/spank_berth.so
	sed -e 's|/usr/local/lib/slurm/|$(PLUGINDIR)/|; s|/usr/local/bin/berth|$(BINDIR)/berth|' \
		plugstack.conf.d/berth.conf > $(DESTDIR)$(DATADIR)/berth.conf
	if [ -n "$(PLUGSTACK_DIR)" ]; then \
		install -d $(DESTDIR)$(PLUGSTACK_DIR) && \
		install -m 0644 $(DESTDIR)$(DATADIR)/berth.conf $(DESTDIR)$(PLUGSTACK_DIR)/berth.conf; \
	fi

deb:
	TARGET_DIR=$(TARGET_DIR) packaging/deb.sh

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/berth $(DESTDIR)$(PLUGINDIR)/spank_berth.so $(DESTDIR)$(DATADIR)/berth.conf
	if [ -n "$(PLUGSTACK_DIR)" ]; then rm -f $(DESTDIR)$(PLUGSTACK_DIR)/berth.conf; fi

clean:
	$(CARGO) clean --target-dir $(TARGET_DIR)
