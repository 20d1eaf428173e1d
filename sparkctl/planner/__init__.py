"""Recipe -> Plan: the engine command line, environment, container settings and memory plan."""
