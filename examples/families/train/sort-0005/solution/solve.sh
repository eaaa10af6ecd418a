#!/bin/bash
sort items.txt > report.txt
