#!/bin/bash
mv values.txt report.txt
