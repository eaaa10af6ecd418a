#!/bin/bash
grep retry values.txt > report.txt
