-- The flavor catalogue is published: every operator change of a flavor (declared,
-- described, deleted) is said as flavor.declared / flavor.retired with a revision from this
-- sequence, so the services that keep a replica (submission, billing) apply the latest
-- change of each flavor and ignore an older one delivered late.
CREATE SEQUENCE flavor_revisions;
